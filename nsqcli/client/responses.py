"""FIN, REQ and TOUCH for one consumer's messages, from any thread: one message (its
responder, a :class:`~nsqcli.client.links.Link`) or many at once, one write per connection.

Every FIN/REQ is written under the consumer's lock and then settled: ``settle(link, n, kind)``
tells the consumer (flow control, counts) - kind "fin", "req", "req_backoff", or "lost" when the
connection was gone (nsqd redelivers those messages). TOUCHes are written under the same lock:
a message is marked answered before its FIN/REQ is written, so a TOUCH either goes out before
the FIN/REQ or sees the mark and is skipped - never a TOUCH after the FIN of its message
(E_TOUCH_FAILED).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import TransportError
from ..protocol import encode_fins, encode_req, encode_touch
from . import limits
from .config import Config
from .conn import CLOSED, Connection


def req_ms(address: str, delay: float) -> int:
    """A REQ delay in ms within what nsqd ``address`` accepts: nsqd <= 1.2 closes the connection
    on a REQ above its --max-req-timeout (E_INVALID), 1.3 clamps it; capped where /config told
    it (nsqcli.client.limits), else left to nsqd."""
    ms = max(0, int(min(delay, 2**31 / 1000) * 1000))  # (not inf: int() would raise)
    cap = limits.value(address, "max_req_timeout")
    return ms if cap is None else min(ms, int(cap * 1000))


class Responses:
    """``pull`` (nsqcli.client.pull.Pull, or None): held messages stop being TOUCHed once answered."""

    def __init__(self, config: Config, *, lock, settle: Callable, pull=None):
        self.config = config
        self._lock = lock
        self._settle = settle
        self._pull = pull

    # -- one message ---------------------------------------------------------------------------
    def finish(self, link, msg) -> None:
        if self._pull is not None:
            self._pull.forget(msg)
        self.respond(link, encode_fins([msg.id]), 1, "fin")

    def requeue(self, link, msg, delay: float | None, backoff: bool) -> None:
        cfg = self.config
        if delay is None:
            delay = min(msg.attempts * cfg.default_requeue_delay, cfg.max_requeue_delay)
        kind = "req_backoff" if backoff else "req"
        if self._pull is not None:
            self._pull.forget(msg)
        self.respond(link, encode_req(msg.id, req_ms(link.address, delay)), 1, kind)

    def touch(self, link, msg) -> None:
        if self.touch_many([msg]):
            raise TransportError("cannot TOUCH: the connection is gone (nsqd will redeliver)", link.address)

    # -- the writes ----------------------------------------------------------------------------
    def respond(self, link, command: bytes, n: int, kind: str) -> bool:
        """Write a FIN/REQ for ``n`` messages; False (settled as "lost") when the connection is
        gone: nsqd will redeliver those messages."""
        with self._lock:
            ok = self.write(link.conn, command)
            self._settle(link, n, kind if ok else "lost")
        return ok

    @staticmethod
    def write(conn: Connection, command: bytes) -> bool:
        """Queue a command on its connection; False when the connection is gone."""
        if conn.state == CLOSED:
            return False
        try:
            conn.send(command)
        except TransportError:
            return False
        return True

    # -- many messages -------------------------------------------------------------------------
    def by_link(self, msgs: list, claim: bool = True) -> dict:
        """Un-answered messages grouped by connection; ``claim`` marks them answered."""
        by_link: dict = {}
        pull = self._pull
        held = pull.held if claim and pull is not None and pull.held else None  # poll()'s, if any
        last = group = None
        for m in msgs:  # hot path (to-file FINs every message here): runs of one connection
            if m.responded:
                continue
            if claim:
                m.responded = True
                if held is not None:
                    held.pop(id(m), None)
            if m.responder is not last:
                last = m.responder
                group = by_link.setdefault(last, [])
            group.append(m)
        return by_link

    def finish_many(self, msgs: list) -> list:
        """FIN many messages, one write per connection; returns those whose FIN could not be
        delivered (their connection is gone: nsqd will deliver them again)."""
        lost = []
        for link, ms in self.by_link(msgs).items():
            if not self.respond(link, encode_fins([m.id for m in ms]), len(ms), "fin"):
                lost += ms
        return lost

    def requeue_many(self, msgs: list, delay: float = 0.0, backoff: bool = False) -> list:
        """REQ many messages (after ``delay`` seconds); returns those that could not be delivered."""
        lost = []
        for link, ms in self.by_link(msgs).items():
            ms_delay = req_ms(link.address, delay)
            command = b"".join([encode_req(m.id, ms_delay) for m in ms])
            if not self.respond(link, command, len(ms), "req_backoff" if backoff else "req"):
                lost += ms
        return lost

    def touch_many(self, msgs: list) -> list:
        """TOUCH many un-answered messages (resets nsqd's timeout); returns those whose
        connection is gone. The un-answered check and the write happen under the lock that
        FIN/REQ writes take."""
        lost = []
        with self._lock:
            for link, ms in self.by_link(msgs, claim=False).items():
                if not self.write(link.conn, b"".join([encode_touch(m.id) for m in ms])):
                    lost += ms
        return lost
