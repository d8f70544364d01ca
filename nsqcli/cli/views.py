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
