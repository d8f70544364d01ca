"""Live views fit the terminal's height as well as its width: at 80x24 with 25 topics the title
stays on screen and a "+N more" row says what is not shown. Renderers are fed directly and
printed to a rich Console of a fixed size."""

from __future__ import annotations

import io
import os
import time
from types import SimpleNamespace

import pytest
from tests.support.helpers import http_post, wait_for
from rich.console import Console

from nsqcli import Config
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


# -- live views --------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 120])
def test_live_tables_fit_the_terminal(sandbox, extra_nsqd, topic, width):
    """Real consumers on two nodes: every line fits, node names keep the port, RDY/in-flight/
    backoff stay, and nothing is truncated to an ellipsis."""
    from rich.console import Console

    from nsqcli.cli.views import connections_table, dashboard
    from nsqcli.client.config import Config
    from nsqcli.client.consumer import Consumer
    from nsqcli.client.stats import compute_rows, poll_nodes

    second = extra_nsqd()
    nodes = [sandbox.nsqd, second]
    for n in nodes:
        http_post(n.http_address, "/mpub", b"a\nb\nc", topic=topic)
    got = []
    consumers = [Consumer(topic, "view", handler=lambda m: got.append(m), config=Config(max_in_flight=50),
                          nsqd_tcp_addresses=[n.tcp_address for n in nodes]).start()]
    try:
        wait_for(lambda: len(got) == 6, what="messages")
        console = Console(record=True, width=width, force_terminal=True, color_system=None)
        console.print(connections_table(consumers, width))
        s1 = poll_nodes([n.http_address for n in nodes], topic, None)
        history = {}
        compute_rows(None, s1, per_node=True, history=history)
        s2 = poll_nodes([n.http_address for n in nodes], topic, None)
        console.print(dashboard(compute_rows(s1, s2, per_node=True, history=history), s2, clients=True, width=width))
        text = console.export_text()
    finally:
        consumers[0].stop()
    lines = text.splitlines()
    assert all(len(ln) <= width for ln in lines), text
    assert "…" not in text, text
    ports = [n.tcp_address.rsplit(":", 1)[1] for n in nodes]
    assert all(f":{p}" in text for p in ports) and "nsqd on 127.0.0.1" in text
    assert "RDY" in text and ("in-flight" in text or "infl" in text) and "backoff" in text
    first_cells = "".join(ln.split("│")[1].strip() for ln in lines if ln.startswith("│"))
    assert f"{topic}/view" in first_cells  # a long topic/channel wraps, it is not cut
    assert "depth" in text and "in/s" in text and "RDY" in text.split("clients")[1]
    if width == 120:
        assert "nsqcli/" in text  # the clients' user agent
        assert "state" in text and "late" in text and "hidden to fit" not in text.split("nsqcli stat")[0]
    else:
        assert "hidden to fit" in text


def test_dashboard_renders_to_a_capture_console():
    from nsqcli.cli.views import dashboard
    from nsqcli.client.stats import Sample, compute_rows

    def stats(depth, msgs, fin):
        return {"topics": [{"topic_name": "orders", "depth": depth, "backend_depth": 5, "message_count": msgs,
                            "paused": False, "channels": [{
                                "channel_name": "billing", "depth": depth, "backend_depth": 5,
                                "in_flight_count": 9, "deferred_count": 1, "message_count": msgs,
                                "requeue_count": 0, "timeout_count": 0, "client_count": 1, "paused": False,
                                "clients": [{"remote_address": "127.0.0.1:5555", "client_id": "w1", "connect_ts": 1,
                                             "user_agent": "nsqcli/0.1.0", "ready_count": 10,
                                             "in_flight_count": 9, "finish_count": fin, "requeue_count": 0}]}]}]}

    history = {}
    s1 = Sample({"n1": 0.0}, {"n1": stats(100, 1000, 10)}, {})
    compute_rows(None, s1, history=history)
    s2 = Sample({"n1": 2.0}, {"n1": stats(60, 1100, 150)}, {"n2": "unreachable"})
    (row,) = compute_rows(s1, s2, history=history)
    assert (row.ingress, row.egress) == (50.0, 70.0)  # per measured second
    assert row.drain_seconds() == 3.0 and "spilling to disk" in row.warnings()
    assert "consumers saturated" in row.warnings()
    console = Console(record=True, width=220, force_terminal=False)
    console.print(dashboard([row], s2, clients=True))
    text = console.export_text()
    assert "orders/billing" in text and "spilling to disk" in text and "down: n2" in text
    assert "127.0.0.1:5555" in text and "nsqcli/0.1.0" in text and "3s" in text
    assert row.sparkline() == "█▅"


def test_tail_and_to_file_live_tables_render(nsqd, topic, tmp_path):
    from nsqcli.archive.archiver import Archiver
    from nsqcli.archive.writer import FileOptions
    from nsqcli.cli.views import archive_table, connections_table

    http_post(nsqd.http_address, "/mpub", b"a\nb\nc", topic=topic)
    a = Archiver(topics=[topic], topic_pattern=None, topic_refresh=60, channel="c",
                 opts=FileOptions(output_dir=str(tmp_path)), formatter=lambda msgs: b"".join(m.body + b"\n" for m in msgs),
                 config=Config(max_in_flight=10), nsqd=[nsqd.tcp_address], lookupd=[], sync_interval=0.1)
    a.start()
    try:
        wait_for(lambda: a.status()[0]["finished"] == 3, what="archived")
        console = Console(record=True, width=200)
        console.print(archive_table(a, 200))
        console.print(connections_table([t.consumer for t in a.topics.values()], 200))
        text = console.export_text()
        assert topic in text and nsqd.tcp_address in text and "connected" in text
        assert os.path.basename(a.status()[0]["file"]) in text
    finally:
        a.stop()


# -- terminals rich cannot drive -------------------------------------------------------------------
def _console(term: str | None, width=80, height=24, terminal=True):
    env = {} if term is None else {"TERM": term}
    return Console(file=io.StringIO(), force_terminal=terminal, width=width, height=height, _environ=env)


@pytest.mark.parametrize("term,size,terminal,why", [
    ("xterm-256color", (80, 24), True, ""),
    ("screen", (40, 6), True, ""),
    ("dumb", (80, 24), True, "TERM=dumb"),
    ("unknown", (80, 24), True, "TERM=unknown"),
    ("DUMB", (80, 24), True, "TERM=DUMB"),
    (None, (80, 24), True, "TERM is not set"),
    ("", (80, 24), True, "TERM is not set"),
    ("xterm", (39, 24), True, "39x24"),
    ("xterm", (120, 5), True, "120x5"),
    ("xterm", (80, 24), False, "not a terminal"),
])
def test_cannot_draw_live_says_why(term, size, terminal, why):
    from nsqcli.cli.views import can_draw_live, cannot_draw_live

    console = _console(term, *size, terminal=terminal)
    got = cannot_draw_live(console)
    assert (why in got and bool(got) == bool(why)), got
    assert can_draw_live(console) is (not why)


def _stat_on_a_pty(nsqd, topic, term: str, rows=30, cols=120, extra=()) -> tuple[int, str]:
    """``nsqcli stat`` with stdout and stderr on a pseudo-terminal of ``rows`` x ``cols``:
    (exit code, everything the terminal received)."""
    import fcntl
    import select
    import struct
    import subprocess
    import termios

    from tests.support.helpers import NSQCLI, clean_env

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = clean_env({"TERM": term})
    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    p = subprocess.Popen(NSQCLI + ["stat", topic, "--nsqd-http-address", nsqd.http_address, "--interval", "0.3s",
                                   "-n", "3", *extra], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every end of the slave is closed
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        rc = p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    return rc, out.decode(errors="replace").replace("\r\n", "\n")


@pytest.fixture
def busy_topic(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"a\nb\nc", topic=topic)
    return topic


def _rows(text: str, topic: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"{topic}/-")]


@pytest.mark.parametrize("term,rows,cols", [("dumb", 30, 120), ("unknown", 30, 120), ("xterm-256color", 4, 120)])
def test_stat_on_a_terminal_rich_cannot_drive_prints_rows(nsqd, busy_topic, term, rows, cols):
    """TERM=dumb (rich would draw nothing until the end), unknown, or a terminal 4 lines high:
    the plain rows every --interval, with no cursor movement or colour."""
    rc, text = _stat_on_a_pty(nsqd, busy_topic, term, rows, cols)
    assert rc == 0, text
    assert "\x1b" not in text, repr(text)
    assert "ingress  egress" in text and "nsqcli stat" not in text  # nsq_stat's header, not the live title
    got = _rows(text, busy_topic)
    assert len(got) == 3 and all(ln.split()[-2] == "3" for ln in got), text  # 3 messages, every report


def test_stat_live_asked_for_on_a_dumb_terminal_says_why_once(nsqd, busy_topic):
    rc, text = _stat_on_a_pty(nsqd, busy_topic, "dumb", extra=["--live"])
    assert rc == 0, text
    warnings = [ln for ln in text.splitlines() if "warning" in ln]
    assert warnings == ["nsqcli: warning: --live: no live view here (TERM=dumb): rows every --interval instead"]
    assert len(_rows(text, busy_topic)) == 3


def test_stat_on_a_real_terminal_still_draws_live(nsqd, busy_topic):
    rc, text = _stat_on_a_pty(nsqd, busy_topic, "xterm-256color")
    assert rc == 0, text
    assert "nsqcli stat" in text and busy_topic[:12] in text  # (a long name folds in its column)
    assert "\x1b[2K" in text or "\x1b[1A" in text, repr(text)  # redrawn in place
    assert "ingress  egress" not in text
