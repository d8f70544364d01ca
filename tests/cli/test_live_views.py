"""Live views fit the terminal's height as well as its width: at 80x24 with 25 topics the title
stays on screen and a "+N more" row says what is not shown. Renderers are fed directly and
printed to a rich Console of a fixed size."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

from rich.console import Console

from nsqcli.cli.views import Rates, archive_table, connections_table, dashboard, live_height
from nsqcli.client.stats import Sample, compute_rows


def _render(renderable, width=80, height=24) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, height=height, color_system=None, force_terminal=False).print(renderable)
    return out.getvalue().splitlines()


def _stats(n: int, msgs: int) -> dict:
    return {"topics": [{"topic_name": f"topic{i:02d}", "depth": 0, "backend_depth": 0, "message_count": msgs,
                        "paused": False, "channels": []} for i in range(n)]}


def _stat_view(n: int, height: int | None):
    history = {}
    s1 = Sample({"n1": 0.0}, {"n1": _stats(n, 100)}, {})
    compute_rows(None, s1, history=history)
    s2 = Sample({"n1": 1.0}, {"n1": _stats(n, 150)}, {})
    return dashboard(compute_rows(s1, s2, history=history), s2, width=80, height=height)


def test_stat_with_25_topics_fits_24_lines_and_says_how_many_more():
    console = SimpleNamespace(height=24)
    lines = _render(_stat_view(25, live_height(console)))
    assert len(lines) <= 23, "\n".join(lines)
    assert "nsqcli stat" in lines[0]  # the title is the first line: nothing scrolled it away
    more = [ln for ln in lines if "more" in ln]
    assert len(more) == 1 and "+" in more[0], "\n".join(lines)
    shown = sum(1 for ln in lines if "topic" in ln and "/-" in ln)
    assert f"+{25 - shown} more" in more[0]
    assert any("nodes up: 1" in ln for ln in lines)


def test_stat_shows_every_row_when_they_fit():
    lines = _render(_stat_view(5, 23))
    assert not any("more" in ln for ln in lines) and sum("/-" in ln for ln in lines) == 5
    assert len(_render(_stat_view(25, None))) > 24  # without a height, everything (plain output, tests)


class _Consumer:
    def __init__(self, topic, n, received):
        self.topic = topic
        self._stats = [SimpleNamespace(address=f"127.0.0.1:{4150 + i}", state="connected", rdy=1, in_flight=0,
                                       received=received, finished=received, requeued=0, timed_out=0, lost=0,
                                       late=0, backoff=None, last_message=time.time()) for i in range(n)]

    def stats(self):
        return self._stats


def test_tail_live_fits_the_height_and_has_a_msgs_per_second_column():
    now = [0.0]
    rates = Rates(clock=lambda: now[0])
    consumers = [_Consumer("events", 30, 0)]
    connections_table(consumers, 120, 23, rates)  # the first look: no rate yet
    now[0] = 2.0
    for s in consumers[0].stats():
        s.received = 500
    lines = _render(connections_table(consumers, 120, 23, rates), width=120)
    assert len(lines) <= 23 and "nsqcli connections" in lines[0]
    assert "msg/s" in "\n".join(lines[:4])  # (the short header at this width)
    assert any(" 250 " in ln for ln in lines)  # 500 messages in 2 s
    assert any("more" in ln for ln in lines)


def test_to_file_live_tables_share_the_height():
    rows = [{"topic": f"t{i}", "file": f"/w/t{i}.log", "size": 1, "received": 1, "pending": 0, "syncs": 0,
             "last_sync": None, "closed": 0} for i in range(40)]
    archiver = SimpleNamespace(status=lambda: rows, rates={})
    lines = _render(archive_table(archiver, 80, 11))
    assert len(lines) <= 11 and "nsqcli to-file" in lines[0] and any("more" in ln for ln in lines)
