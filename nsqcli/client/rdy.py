"""RDY on the wire for one consumer: the counts its flow control decides (nsqcli.client.flow)
written to each connection (nsqcli.client.links.Link keeps what was written last).

Decreases go out at once. When the same change set also raises RDY elsewhere, the raises wait
``RDY_SETTLE`` seconds: each nsqd reads its own socket, so without the pause a raise on one
nsqd could take effect before the matching cut on another and the total ready count seen by
the nsqds would briefly exceed max_in_flight. The consumer's timer step sends them when due.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import TransportError
from ..protocol import encode_rdy
from .conn import CLOSED
from .flow import Flow

#: seconds between cutting RDY on some connections and raising it on others
RDY_SETTLE = 0.05


class RdyWriter:
    """Called with the consumer's lock held. ``links``: the consumer's connected links by
    address (read for the check); ``wake()`` brings the timer step forward; ``check()`` says
    whether to check, at every raise, that the RDY of all connections adds up to no more than
    max_in_flight - a breach is appended to ``breaches`` (tests/conftest.py turns it on)."""

    def __init__(self, flow: Flow, links: dict, *, wake: Callable[[], None], check: Callable[[], bool],
                 breaches: list):
        self.flow = flow
        self.pending: dict = {}  # link -> (count, when): delayed raises
        self._links = links
        self._wake = wake
        self._check = check
        self._breaches = breaches

    def send(self, changes: list) -> None:
        """Write RDY changes ``[(link, count)]`` (decreases first, as flow control gives them)."""
        if not changes:
            return
        now = time.monotonic()
        has_down = any(n < link.rdy for link, n in changes)
        for link, n in changes:
            if n < link.rdy or not has_down:
                self.pending.pop(link, None)
                self.write(link, n)
            else:
                self.pending[link] = (n, now + RDY_SETTLE)
        if self.pending:
            self._wake()

    def write(self, link, n: int) -> None:
        raised = n > link.rdy
        link.rdy = n
        if raised and self._check():  # (a cut never breaches, even while the others' cuts are on their way)
            total = sum(h.rdy for h in self._links.values() if h is not link) + n
            if total > self.flow.max_in_flight:
                self._breaches.append(f"RDY {n} to {link.address} makes {total} in all, above max_in_flight "
                                      f"{self.flow.max_in_flight}")
        try:
            link.conn.send(encode_rdy(min(n, link.conn.max_rdy_count)))
        except TransportError:
            pass

    def flush_due(self, now: float) -> float:
        """Send the delayed raises that are due; returns seconds until the next one."""
        wait = 1.0
        for link, (n, when) in list(self.pending.items()):
            if now >= when:
                del self.pending[link]
                if link.conn.state != CLOSED:
                    self.write(link, n)
            else:
                wait = min(wait, when - now)
        return wait

    def forget(self, link) -> None:
        """``link`` closed: no delayed raise for it."""
        self.pending.pop(link, None)

