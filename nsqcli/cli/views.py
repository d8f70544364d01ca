"""rich live views on stderr (only on a TTY). A refresh thread renders snapshots taken from the
consumers' own locked state (rich's Live does the refreshing)."""

from __future__ import annotations

import time


def connections_table(consumers):
    from rich.table import Table

    table = Table(title="nsqcli connections", expand=False)
    for col in ("topic", "nsqd", "state", "RDY", "in-flight", "received", "finished", "requeued",
                "timed out", "lost acks", "late", "backoff", "last msg"):
        table.add_column(col, justify="right" if col not in ("topic", "nsqd", "state", "backoff") else "left")
    now = time.time()
    for c in consumers:
        for s in c.stats():
            age = f"{now - s.last_message:.1f}s" if s.last_message else "-"
            table.add_row(c.topic, s.address, s.state, str(s.rdy), str(s.in_flight), str(s.received),
                          str(s.finished), str(s.requeued), str(s.timed_out), str(s.lost),
                          str(s.late), s.backoff or "-", age)
    return table


class LiveConnections:
    def __init__(self, console, consumers, refresh_per_second: float = 4):
        from rich.live import Live

        self.consumers = consumers
        self.live = Live(get_renderable=lambda: connections_table(self.consumers), console=console,
                         refresh_per_second=refresh_per_second, transient=False)

    def start(self) -> "LiveConnections":
        self.live.start()
        return self

    def stop(self) -> None:
        self.live.stop()


def archive_table(archiver):
    from rich.table import Table

    table = Table(title="nsqcli to-file", expand=False)
    for col in ("topic", "current file", "bytes", "received", "msg/s", "pending", "syncs", "last sync",
                "files closed"):
        table.add_column(col, justify="left" if col in ("topic", "current file") else "right")
    now = time.time()
    for row in archiver.status():
        rate = archiver.rates.get(row["topic"], 0.0) if hasattr(archiver, "rates") else 0.0
        age = f"{now - row['last_sync']:.1f}s ago" if row["last_sync"] else "-"
        table.add_row(row["topic"], row["file"] or "-", f"{row['size']:,}", f"{row['received']:,}",
                      f"{rate:,.0f}", str(row["pending"]), str(row["syncs"]), age, str(row["closed"]))
    return table


class LiveArchive:
    """Topics (file, bytes, rate, last sync) above the connections (RDY, in-flight)."""

    def __init__(self, console, archiver, refresh_per_second: float = 2):
        from rich.console import Group
        from rich.live import Live

        self.archiver = archiver
        self._last: dict[str, tuple[float, int]] = {}
        archiver.rates = {}

        def render():
            self._update_rates()
            consumers = [a.consumer for a in list(archiver.topics.values())]
            return Group(archive_table(archiver), connections_table(consumers))

        self.live = Live(get_renderable=render, console=console, refresh_per_second=refresh_per_second)

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
        self.live.stop()


def _fmt_drain(seconds) -> str:
    if seconds is None:
        return "∞"
    if seconds == 0:
        return "-"
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def dashboard(rows, sample, clients: bool = False):
    """The `nsqcli stat` live view of one sample: a row per topic/channel (or node), rates,
    depth with a sparkline, time to drain, warnings; nodes down; optionally every client."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(title="nsqcli stat", expand=False)
    for col in ("topic/channel", "in/s", "out/s", "depth", "mem", "disk", "history", "drain", "inflt",
                "def", "req/s", "t-o/s", "msgs", "clients", "warnings"):
        t.add_column(col, justify="left" if col in ("topic/channel", "history", "warnings") else "right")
    for r in rows:
        name = f"{r.topic}/{r.channel or '-'}" + (f" @{r.node}" if r.node != "*" else "")
        t.add_row(name, f"{r.ingress:,.0f}", f"{r.egress:,.0f}", f"{r.depth:,}", f"{r.mem:,}",
                  f"{r.backend_depth:,}", r.sparkline(), _fmt_drain(r.drain_seconds()), str(r.in_flight),
                  str(r.deferred), f"{r.requeue_rate:,.1f}", f"{r.timeout_rate:,.1f}", f"{r.messages:,}",
                  str(r.clients), Text(", ".join(r.warnings()), style="yellow"))
    parts = [t]
    status = Text(f"nodes up: {len(sample.stats)}")
    if sample.down:
        status.append(f"   down: {', '.join(sorted(sample.down))}", style="bold red")
    parts.append(status)
    if clients:
        c = Table(title="clients", expand=False)
        for col in ("topic/channel", "address", "user agent", "RDY", "in-flight", "finished", "requeued",
                    "connected for"):
            c.add_column(col)
        now = time.time()
        for r in rows:
            for cl in r.client_list:
                c.add_row(f"{r.topic}/{r.channel}", cl.get("remote_address", ""), cl.get("user_agent", ""),
                          str(cl.get("ready_count", 0)), str(cl.get("in_flight_count", 0)),
                          str(cl.get("finish_count", 0)), str(cl.get("requeue_count", 0)),
                          f"{now - cl.get('connect_ts', now):.0f}s")
        parts.append(c)
    return Group(*parts)
