"""Ask many nodes at once: ``ask_all(items, fn, timeout)`` calls ``fn(item)`` for every item on
a few short-lived daemon threads and returns one :class:`Answer` per item, in input order.

The round has ONE deadline (``timeout`` plus a little slack), so a node that hangs costs one
deadline for the whole round, never one per node. ``fn`` is expected to keep its own deadline
(http_json's total deadline, a handshake's) of at most ``timeout``; an item still running at the
end of the round - ``fn`` stuck past its deadline, in DNS say, or not started because every
thread was busy - is answered with a :class:`~nsqcli.errors.Timeout` naming it, and its thread
is left to finish on its own (a daemon: it never holds the caller or the exit).

Not a ThreadPoolExecutor: its workers are joined at interpreter exit, so one stuck request
would hold ``nsqcli`` open after its answer; and they outlive the round, which a CLI that asks
once does not need. A signal in the caller (Ctrl-C) ends the wait at once.
"""

from __future__ import annotations

import threading
import time

from ..errors import Timeout

#: the most threads one round starts (a 40-node stat: 32 at once, the rest as they free up)
MAX_THREADS = 32
#: past ``timeout``: time for a request that gave up at its own deadline to say so
SLACK = 0.5
#: how often a round with ``cancel`` looks at it
CANCEL_LOOK = 0.05


class Answer:
    """What one item gave: ``value``, or ``error`` (the exception ``fn`` raised, or Timeout)."""

    __slots__ = ("value", "error")

    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error

    @property
    def ok(self) -> bool:
        return self.error is None

    def __repr__(self) -> str:
        return f"Answer(error={self.error!r})" if self.error is not None else f"Answer({self.value!r})"


def ask_all(items, fn, timeout: float, *, catch=Exception, name=str, threads: int = MAX_THREADS,
            slack: float = SLACK, cancel=None) -> list[Answer]:
    """``fn(item)`` for every item of ``items`` concurrently (at most ``threads`` at a time);
    one Answer per item in input order, within about ``timeout + slack`` seconds whatever the
    items do.

    An exception of a ``catch`` type (a class or a tuple of them) becomes that item's ``error``;
    any other (a bug) is raised here once the round is over, the first in input order. An item
    not answered by the end of the round gets ``Timeout("no answer within Ns", name(item))``.

    ``cancel()`` (looked at every CANCEL_LOOK s) True ends the round early (a consumer
    interrupted while it asks its lookupds): the items not answered yet get that Timeout."""
    items = list(items)
    if not items:
        return []
    round_ = _Round(items, fn, max(1, min(threads, len(items))))
    round_.wait(time.monotonic() + timeout + slack, cancel)
    answers = []
    for item, a in zip(items, round_.take()):
        if a is None:
            a = Answer(error=Timeout(f"no answer within {timeout:g}s", name(item)))
        elif a.error is not None and not isinstance(a.error, catch):
            raise a.error
        answers.append(a)
    return answers


class _Round:
    """The threads of one ask_all: each takes the next item until none is left or the round ended."""

    def __init__(self, items: list, fn, n_threads: int):
        self.items, self.fn = items, fn
        self.answers: list[Answer | None] = [None] * len(items)
        self.next = 0
        self.left = len(items)
        self.over = False
        self.lock = threading.Lock()
        self.done = threading.Event()
        for _ in range(n_threads):
            threading.Thread(target=self._work, name="nsqcli-ask", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self.lock:
                if self.over or self.next >= len(self.items):
                    return
                i, self.next = self.next, self.next + 1
            try:
                answer = Answer(self.fn(self.items[i]))
            except Exception as e:  # noqa: BLE001 - handed to the caller, which sorts it
                answer = Answer(error=e)
            with self.lock:
                if self.over:
                    return
                self.answers[i] = answer
                self.left -= 1
                if not self.left:
                    self.done.set()

    def wait(self, end: float, cancel=None) -> None:
        if cancel is None:
            self.done.wait(max(0.0, end - time.monotonic()))
            return
        while not cancel() and not self.done.wait(max(0.0, min(CANCEL_LOOK, end - time.monotonic()))):
            if time.monotonic() >= end:
                return

    def take(self) -> list[Answer | None]:
        """The answers so far; later ones are dropped and no item is started any more."""
        with self.lock:
            self.over = True
            return list(self.answers)
