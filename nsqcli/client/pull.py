"""A Consumer's pull mode (``Consumer(..., pull=True)``): recv batches are held for
:meth:`Pull.poll`, nothing is answered automatically, and every held message - from its
arrival, polled or not - is TOUCHed every ``touch_interval`` (at most half the msg_timeout nsqd
negotiated) while the config sets one. The TOUCHes run on the consumer's timer step."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from .config import Config

log = logging.getLogger("nsqcli.client.consumer")


class Pull:
    """Held batches. ``held`` (id(message) -> message, not answered yet) is kept under the
    consumer's ``lock``; ``touch(msgs)`` is the consumer's touch_many, ``msg_timeouts()`` the
    msg_timeout nsqd granted each live connection."""

    def __init__(self, config: Config, *, lock, touch: Callable, msg_timeouts: Callable):
        self.config = config
        self.held: dict[int, object] = {}
        self._lock = lock
        self._touch = touch
        self._msg_timeouts = msg_timeouts
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # batches for poll()
        self._pulled: list = []   # the rest of a recv batch poll() split
        self.next_touch = 0.0

    # -- from the I/O loop -----------------------------------------------------------------------
    @staticmethod
    def split(msgs: list) -> list:
        return msgs  # poll() takes whole batches, and splits them itself

    def arrived(self, msgs: list) -> None:
        """(under the lock) Held from arrival: TOUCHed even before poll() takes them."""
        held = self.held
        for m in msgs:
            held[id(m)] = m

    def dispatch(self, link, msgs: list) -> None:
        self._queue.put((link, msgs))

    def forget(self, msg) -> None:
        """``msg`` is answered (FIN/REQ): no more TOUCHes for it."""
        self.held.pop(id(msg), None)

    def forget_conn(self, conn) -> None:
        """(under the lock) ``conn`` closed: nsqd delivers its messages again, nothing to keep alive."""
        held = self.held
        if held:
            for key, m in list(held.items()):
                if m.responder.conn is conn:
                    del held[key]

    # -- the caller's thread ---------------------------------------------------------------------
    def poll(self, max_messages: int, timeout: float | None = None) -> list:
        """See Consumer.poll."""
        out = self._pulled[:max_messages]
        del self._pulled[:max_messages]
        wait = timeout
        while len(out) < max_messages:
            try:
                item = self._queue.get(timeout=wait) if wait != 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            wait = 0
            if item is None or isinstance(item, threading.Event):
                if isinstance(item, threading.Event):
                    item.set()
                continue
            msgs = item[1]
            room = max_messages - len(out)
            out += msgs[:room]
            self._pulled += msgs[room:]
        return out

    # -- the timer thread ------------------------------------------------------------------------
    def touch_due(self, now: float) -> None:
        """TOUCH every held message when the interval is up."""
        interval = self.config.touch_interval
        if not interval or now < self.next_touch:
            return
        with self._lock:
            held = list(self.held.values())
        # never slower than half the msg_timeout nsqd negotiated (it may be shorter than the
        # configured interval assumed)
        timeouts = self._msg_timeouts()
        if timeouts:
            interval = min(interval, min(timeouts) / 2)
        self.next_touch = now + interval
        if held:
            self._touch(held)
            limit = min((m.responder.conn.negotiated.max_msg_timeout or 0) for m in held)
            oldest = min(m.timestamp for m in held)
            if limit and time.time() - oldest / 1e9 > 0.8 * limit:
                log.warning("held messages are nearing nsqd's max_msg_timeout (%.0fs): nsqd will "
                            "redeliver them even though they are TOUCHed", limit)

    def next_touch_in(self, now: float) -> float | None:
        """Seconds until the next TOUCH round (None: no TOUCHes configured)."""
        if not self.config.touch_interval:
            return None
        return max(0.0, self.next_touch - now)
