"""rich live views on stderr (only on a TTY). A refresh thread renders snapshots taken from the
consumers' own locked state (rich's Live does the refreshing)."""

from __future__ import annotations

import time


def connections_table(consumers):
    from rich.table import Table

    table = Table(title="nsqcli connections", expand=False)
    for col in ("topic", "nsqd", "state", "RDY", "in-flight", "received", "finished", "requeued",
                "timed out", "backoff", "last msg"):
        table.add_column(col, justify="right" if col not in ("topic", "nsqd", "state", "backoff") else "left")
    now = time.time()
    for c in consumers:
        for s in c.stats():
            age = f"{now - s.last_message:.1f}s" if s.last_message else "-"
            table.add_row(c.topic, s.address, s.state, str(s.rdy), str(s.in_flight), str(s.received),
                          str(s.finished), str(s.requeued), str(s.timed_out), s.backoff or "-", age)
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
