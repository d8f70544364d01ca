"""rich live views on stderr (only on a TTY). A refresh thread renders snapshots taken from the
consumers' own locked state (rich's Live does the refreshing).

Every table is fitted to the terminal's current width at each refresh (so a resize redraws it
to the new width): columns carry a priority; when the table is too wide, headers are shortened
first, then the least important columns are dropped (and named in the caption), never every
cell truncated to 'a…'. nsqd addresses are shortened to what tells them apart (the port when
every node is on one host).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Col:
    name: str
    short: str
    priority: int          # 1 = always shown; higher numbers are dropped first
    right: bool = True     # numbers right-aligned


def _cell_width(value) -> int:
    return len(value.plain) if hasattr(value, "plain") else len(str(value))


def fitted_table(title: str, cols: list[Col], rows: list[list], width: int, caption: str = "",
                 height: int | None = None):
    """A rich Table of ``rows`` that fits ``width``: short headers, then fewer columns; and,
    with ``height``, at most that many lines: the first rows that fit and a "+N more" row."""
    table = _fitted_table(title, cols, rows, width, caption)
    if height is None or not rows or rendered_height(table, width) <= height:
        return table
    lo, hi = 0, len(rows) - 1  # the most rows that fit with the "+N more" row below them
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if rendered_height(_fitted_table(title, cols, rows[:mid], width, caption, len(rows) - mid), width) <= height:
            lo = mid
        else:
            hi = mid - 1
    return _fitted_table(title, cols, rows[:lo], width, caption, len(rows) - lo)


def rendered_height(renderable, width: int) -> int:
    """Lines ``renderable`` takes on a terminal ``width`` columns wide."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, height=10_000, color_system=None)
    return len(console.render_lines(renderable, console.options, pad=False))


def _fitted_table(title: str, cols: list[Col], rows: list[list], width: int, caption: str = "",
                  more: int = 0):
    from rich.table import Table

    fold_at = max(16, width // 3)  # a long name (topic/channel) wraps at this width instead of
                                   # pushing every other column out

    def need(idx: list[int], short: bool) -> int:
        total = 1  # the left border
        for i in idx:
            head = cols[i].short if short else cols[i].name
            cell = max([len(head)] + [_cell_width(r[i]) for r in rows])
            if not cols[i].right:
                cell = min(cell, max(len(head), fold_at))
            total += cell + 3  # padding + separator
        return total

    idx = list(range(len(cols)))
    short = need(idx, False) > width
    dropped: list[str] = []
    while need(idx, short) > width and len(idx) > 1:
        worst = max(idx, key=lambda i: (cols[i].priority, i))
        if cols[worst].priority <= 1:
            break
        idx.remove(worst)
        dropped.append(cols[worst].short)
    if dropped:
        caption = (caption + "  " if caption else "") + f"(hidden to fit: {', '.join(reversed(dropped))}; widen the terminal)"
    table = Table(title=title, caption=caption or None, expand=False, caption_justify="left")
    for i in idx:
        table.add_column(cols[i].short if short else cols[i].name, justify="right" if cols[i].right else "left",
                         no_wrap=cols[i].priority > 1, overflow="fold")
    for r in rows:
        table.add_row(*[r[i] if hasattr(r[i], "plain") else str(r[i]) for i in idx])
    if more:
        table.add_row(f"+{more} more", *[""] * (len(idx) - 1), style="dim")
    return table


def short_names(addresses) -> tuple[dict[str, str], str]:
    """Display names for nsqd addresses that keep what distinguishes them: ':4150' when every
    address is on one host (the host goes in the returned note), the host when every port is
    the same, and a common domain suffix left out. Returns ({address: name}, note)."""
    addrs = sorted(set(addresses))
    if len(addrs) <= 1:
        return {a: a for a in addrs}, ""
    parts = {}
    for a in addrs:
        host, _, port = a.rpartition(":")
        parts[a] = (host or a, port)
    hosts = {h for h, _ in parts.values()}
    ports = {p for _, p in parts.values()}
    if len(hosts) == 1:
        return {a: f":{p}" for a, (h, p) in parts.items()}, f"nsqd on {next(iter(hosts))}"
    suffix = _common_domain_suffix(hosts)
    names = {}
    for a, (h, p) in parts.items():
        short_host = h[: -len(suffix)] if suffix and h.endswith(suffix) and h != suffix else h
        names[a] = short_host if len(ports) == 1 else f"{short_host}:{p}"
    return names, (f"hosts *{suffix}" if suffix else "") + (f" port {next(iter(ports))}" if len(ports) == 1 else "")


def _common_domain_suffix(hosts: set[str]) -> str:
    if any(h.replace(".", "").isdigit() or ":" in h for h in hosts):
        return ""  # IP addresses: no domain to drop
    split = [h.split(".") for h in hosts]
    common = []
    for labels in zip(*[list(reversed(s)) for s in split]):
        if len(set(labels)) != 1:
            break
        common.append(labels[0])
    if not common or any(len(s) <= len(common) for s in split):
        return ""
    return "." + ".".join(reversed(common))


CONNECTION_COLS = [Col("topic", "topic", 2, False), Col("nsqd", "nsqd", 1, False), Col("state", "state", 6, False),
                   Col("RDY", "RDY", 1), Col("in-flight", "infl", 1), Col("msgs/s", "msg/s", 2),
                   Col("received", "recv", 2),
                   Col("FINed", "fin", 2), Col("requeued", "req", 3), Col("timed out", "t-o", 3),
                   Col("lost acks", "lost", 4), Col("late", "late", 6), Col("backoff", "backoff", 2, False),
                   Col("last msg", "last", 5)]


def connections_table(consumers, width: int = 120, height: int | None = None, rates: "Rates | None" = None):
    """A row per connection: RDY, in flight (held by nsqcli, not yet answered), messages a
    second (over the last second or so, from ``rates``), received, FINed, requeued, timed out
    (answered after nsqd's timeout), lost acks, late, backoff state. At most ``height`` lines."""
    now = time.time()
    snaps = [(c.topic, s) for c in consumers for s in c.stats()]
    names, note = short_names([s.address for _, s in snaps])
    one_topic = len({c.topic for c in consumers}) <= 1
    cols = [c for c in CONNECTION_COLS if not (one_topic and c.name == "topic")]
    rows = []
    for topic, s in snaps:
        age = f"{now - s.last_message:.1f}s" if s.last_message else "-"
        rate = rates.rate((topic, s.address), s.received) if rates is not None else None
        row = [topic, names.get(s.address, s.address), s.state, s.rdy, s.in_flight,
               "-" if rate is None else f"{rate:,.0f}", f"{s.received:,}",
               f"{s.finished:,}", f"{s.requeued:,}", s.timed_out, s.lost, s.late, s.backoff or "-", age]
        rows.append(row[1:] if one_topic else row)
    title = "nsqcli connections" + (f" - {consumers[0].topic}" if one_topic and consumers else "")
    if not rows:
        return fitted_table(title, cols, [], width, caption="no nsqd connected yet")
    return fitted_table(title, cols, rows, width, caption=note, height=height)


class Rates:
    """Per-key rates of a growing count, each over the last second or more of refreshes."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._last: dict = {}   # key -> (time, count) of the window's start
        self._rate: dict = {}

    def rate(self, key, count: int) -> float | None:
        now = self.clock()
        t0, n0 = self._last.setdefault(key, (now, count))
        if now - t0 >= 1.0:
            self._rate[key] = (count - n0) / (now - t0)
            self._last[key] = (now, count)
        return self._rate.get(key)


def stop_display(stop) -> None:
    """Call ``stop``: the end of a live view or progress bar, its last redraw and clear. On a
    terminal that hung up (EIO) or a closed stderr there is nothing left to clear, and the
    command's own outcome stands: the stop it was asked for (a hangup is SIGHUP: 129), its
    summary, its resume point. That write failing used to end the command with exit 1 and
    "Input/output error" instead (review)."""
    try:
        stop()
    except OSError:
        pass


def live_height(console) -> int:
    """Lines a live view may take: the terminal's height less one (the cursor's line), so a
    refresh redraws in place instead of scrolling its top away."""
    return max(4, console.height - 1)


#: the smallest terminal a live view is drawn on (columns, lines): below it, status lines
LIVE_MIN_WIDTH, LIVE_MIN_HEIGHT = 40, 6


def cannot_draw_live(console) -> str:
    """Why rich cannot draw a live view on ``console`` (a rich Console), or "" when it can.
    A live view redraws in place with cursor movement; without it (TERM=dumb or unknown -
    rich then prints nothing until the end -, TERM unset on a terminal, a terminal too small
    for a table, not a terminal at all) a command prints status lines (or rows) instead."""
    import os

    if not console.is_terminal:
        return "not a terminal"
    term = getattr(console, "_environ", os.environ).get("TERM", "")
    if console.is_dumb_terminal:
        return f"TERM={term}"
    if not term and os.name != "nt":
        return "TERM is not set"
    width, height = console.size
    if width < LIVE_MIN_WIDTH or height < LIVE_MIN_HEIGHT:
        return f"the terminal is {width}x{height} (a live view needs {LIVE_MIN_WIDTH}x{LIVE_MIN_HEIGHT})"
    return ""


def can_draw_live(console) -> bool:
    """True when a live view can be drawn on ``console`` (see cannot_draw_live for why not)."""
    return not cannot_draw_live(console)


class LiveConnections:
    def __init__(self, console, consumers, refresh_per_second: float = 4):
        from rich.live import Live

        self.consumers = consumers
        self.rates = Rates()
        self.live = Live(get_renderable=lambda: connections_table(self.consumers, console.width,
                                                                  live_height(console), self.rates),
                         console=console, refresh_per_second=refresh_per_second, transient=False,
                         vertical_overflow="visible")

    def start(self) -> "LiveConnections":
        self.live.start()
        return self

    def stop(self) -> None:
        stop_display(self.live.stop)


ARCHIVE_COLS = [Col("topic", "topic", 1, False), Col("current file", "file", 4, False), Col("bytes", "bytes", 2),
                Col("received", "recv", 2), Col("msg/s", "msg/s", 1), Col("held (unsynced)", "held", 1),
                Col("syncs", "syncs", 5), Col("last sync", "synced", 2), Col("files closed", "closed", 5)]


def archive_table(archiver, width: int = 120, height: int | None = None):
    import os

    now = time.time()
    rows = []
    for row in archiver.status():
        rate = archiver.rates.get(row["topic"], 0.0) if hasattr(archiver, "rates") else 0.0
        age = f"{now - row['last_sync']:.1f}s ago" if row["last_sync"] else "-"
        rows.append([row["topic"], os.path.basename(row["file"]) if row["file"] else "-", f"{row['size']:,}",
                     f"{row['received']:,}", f"{rate:,.0f}", row["pending"], row["syncs"], age, row["closed"]])
    work = next((os.path.dirname(r["file"]) for r in archiver.status() if r["file"]), "")
    return fitted_table("nsqcli to-file", ARCHIVE_COLS, rows, width, caption=f"in {work}" if work else "",
                        height=height)


class LiveArchive:
    """Topics (file, bytes, rate, last sync) above the connections (RDY, in-flight)."""

    def __init__(self, console, archiver, refresh_per_second: float = 2):
        from rich.console import Group
        from rich.live import Live

        self.archiver = archiver
        self._last: dict[str, tuple[float, int]] = {}
        archiver.rates = {}

        rates = Rates()

        def render():  # the topics get half the height (at least), the connections the rest
            self._update_rates()
            consumers = [a.consumer for a in list(archiver.topics.values())]
            width, height = console.width, live_height(console)
            topics = archive_table(archiver, width, max(4, height // 2))
            rest = max(4, height - rendered_height(topics, width))
            return Group(topics, connections_table(consumers, width, rest, rates))

        self.live = Live(get_renderable=render, console=console, refresh_per_second=refresh_per_second,
                         vertical_overflow="visible")

    def _update_rates(self) -> None:
        now = time.monotonic()
        for row in self.archiver.status():
            t0, n0 = self._last.get(row["topic"], (now, row["received"]))
            if now - t0 >= 1.0:
                self.archiver.rates[row["topic"]] = (row["received"] - n0) / (now - t0)
                self._last[row["topic"]] = (now, row["received"])
            else:
                self._last.setdefault(row["topic"], (t0, n0))

    def start(self) -> "LiveArchive":
        self.live.start()
        return self

    def stop(self) -> None:
        stop_display(self.live.stop)


def _fmt_drain(seconds) -> str:
    if seconds is None:
        return "∞"
    if seconds == 0:
        return "-"
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


STAT_COLS = [Col("topic/channel", "topic/channel", 1, False), Col("in/s", "in/s", 1), Col("out/s", "out/s", 1),
             Col("depth", "depth", 1), Col("mem", "mem", 5), Col("disk", "disk", 4),
             Col("history", "history", 6, False), Col("drain", "drain", 3), Col("in-flight", "infl", 2),
             Col("deferred", "def", 5), Col("req/s", "req/s", 3), Col("t-o/s", "t-o/s", 3),
             Col("messages", "msgs", 4), Col("clients", "cl", 2), Col("warnings", "warnings", 2, False)]
CLIENT_COLS = [Col("topic/channel", "topic/channel", 1, False), Col("client", "client", 1, False),
               Col("user agent", "agent", 4, False), Col("RDY", "RDY", 1), Col("in-flight", "infl", 1),
               Col("FINed", "fin", 2), Col("requeued", "req", 2), Col("connected for", "up", 3)]


def dashboard(rows, sample, clients: bool = False, width: int = 120, height: int | None = None):
    """The `nsqcli stat` live view of one sample: a row per topic/channel (or node), rates,
    depth with a sparkline, time to drain, warnings; nodes down; optionally every client.
    With ``height``: at most that many lines ("+N more" rows; clients get at most half)."""
    from rich.console import Group
    from rich.text import Text

    names, note = short_names([r.node for r in rows if r.node != "*"] + list(sample.stats) + list(sample.down))
    body = []
    for r in rows:
        name = f"{r.topic}/{r.channel or '-'}" + (f" @{names.get(r.node, r.node)}" if r.node != "*" else "")
        body.append([name, f"{r.ingress:,.0f}", f"{r.egress:,.0f}", f"{r.depth:,}", f"{r.mem:,}",
                     f"{r.backend_depth:,}", r.sparkline(), _fmt_drain(r.drain_seconds()), r.in_flight,
                     r.deferred, f"{r.requeue_rate:,.1f}", f"{r.timeout_rate:,.1f}", f"{r.messages:,}",
                     r.clients, Text(", ".join(r.warnings()), style="yellow")])
    cols = STAT_COLS
    if not any(r[-1].plain for r in body):  # no warnings anywhere: no empty column
        cols, body = cols[:-1], [r[:-1] for r in body]
    status = Text(f"nodes up: {len(sample.stats)}")
    if sample.down:
        status.append(f"   down: {', '.join(sorted(sample.down))}", style="bold red")
    client_table = _clients_table(rows, width, None if height is None else max(4, height // 2)) if clients else None
    left = None
    if height is not None:
        left = max(4, height - rendered_height(status, width)
                   - (rendered_height(client_table, width) if client_table is not None else 0))
    parts = [fitted_table("nsqcli stat", cols, body, width, caption=note, height=left), status]
    if client_table is not None:
        parts.append(client_table)
    return Group(*parts)


def _clients_table(rows, width: int, height: int | None):
    """Every client of every row, at most ``height`` lines."""
    now = time.time()
    client_rows = [[f"{r.topic}/{r.channel}", cl.get("client_id") or cl.get("remote_address", ""),
                    cl.get("user_agent", ""), cl.get("ready_count", 0), cl.get("in_flight_count", 0),
                    f"{cl.get('finish_count', 0):,}", f"{cl.get('requeue_count', 0):,}",
                    f"{now - cl.get('connect_ts', now):.0f}s"] for r in rows for cl in r.client_list]
    for cr, cl in zip(client_rows, [cl for r in rows for cl in r.client_list]):
        if cl.get("client_id") and cl.get("remote_address"):
            cr[1] = f"{cl['client_id']} {cl['remote_address']}"
    return fitted_table("clients", CLIENT_COLS, client_rows, width, height=height)
