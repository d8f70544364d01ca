"""The threads a process's consumers share, so that their number does not grow with the
consumers: a to-file over 200 topics runs 200 Consumers on a dozen threads, not 600.

- :data:`TIMERS` - one thread runs every consumer's timer step (RDY redistribution, delayed
  RDY raises, backoff expiry, TOUCH of held messages, due reconnects and lookupd polls). A
  step never blocks; it returns the seconds until it wants to run again.
- :data:`BLOCKING` - a few threads for the blocking calls a step hands off (lookupd polls,
  each under its own deadline); they end after a second without work.
- :class:`HandlerPool` - the handler threads: a consumer's own, or one pool shared by many
  consumers (to-file's topics), fed whole recv batches through one SimpleQueue.

Threads start on first use and end when nothing needs them: a process with no consumer has
none of these.
"""

from __future__ import annotations

import collections
import heapq
import logging
import os
import queue
import threading
import time
from collections import deque

log = logging.getLogger("nsqcli.client.workers")

#: a step that failed runs again after this many seconds
RETRY_STEP = 1.0
#: threads for blocking calls (lookupd polls: each asks its lookupds at once, a thread each,
#: so a poll costs 1 + lookupds threads while it runs)
BLOCKING_THREADS = 2
#: the due time of a step while it runs (any real due time is below it)
RUNNING = float("inf")


class Timers:
    """One thread running many keys' steps: ``step(now) -> seconds until the next run``.

    Due times sit in a heap (a step that is rescheduled or woken leaves its old entry behind,
    skipped when it surfaces): thousands of consumers cost O(log n) a step, not a scan."""

    def __init__(self, name: str = "nsqcli-timers"):
        self.name = name
        self._cond = threading.Condition()
        self._steps: dict = {}
        self._next: dict = {}       # key -> its due time (the heap may hold stale ones too)
        self._heap: list = []       # (due, seq, key)
        self._seq = 0
        self._running = None
        self._thread: threading.Thread | None = None

    def _schedule(self, key, when: float) -> None:
        self._next[key] = when
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, key))

    def add(self, key, step) -> None:
        """Run ``step`` now and then whenever it asked to (or is woken)."""
        with self._cond:
            self._steps[key] = step
            self._schedule(key, 0.0)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def remove(self, key) -> None:
        """No more runs of ``key``'s step; waits for one in progress (except on this thread)."""
        with self._cond:
            self._steps.pop(key, None)
            self._next.pop(key, None)
            self._cond.notify_all()
            if threading.current_thread() is not self._thread:
                while self._running is key:
                    self._cond.wait(1.0)

    def wake(self, key) -> None:
        """Run ``key``'s step as soon as possible."""
        with self._cond:
            if key in self._next and self._next[key] > 0.0:
                self._schedule(key, 0.0)
                self._cond.notify_all()

    def _run(self) -> None:
        cond, heap = self._cond, self._heap
        with cond:
            while self._steps:
                if not heap:
                    cond.wait(1.0)
                    continue
                when, _, key = heap[0]
                if self._next.get(key) != when:  # stale: rescheduled, woken or removed since
                    heapq.heappop(heap)
                    continue
                now = time.monotonic()
                if when > now:
                    cond.wait(when - now)
                    continue
                heapq.heappop(heap)
                step = self._steps[key]
                self._next[key] = RUNNING  # a wake() during the step runs it again at once
                self._running = key
                cond.release()
                try:
                    delay = step(now)
                except Exception as e:  # the step reports its own errors; never lose the thread
                    log.error("timer step failed: %s: %s", type(e).__name__, e)
                    log.debug("traceback", exc_info=True)
                    delay = RETRY_STEP
                finally:
                    cond.acquire()
                    self._running = None
                    cond.notify_all()
                if self._next.get(key) == RUNNING:
                    self._schedule(key, time.monotonic() + max(0.001, delay))
            heap.clear()
            self._thread = None


class Blocking:
    """Up to ``size`` threads for blocking calls; each ends after ``idle`` seconds without work."""

    def __init__(self, size: int = 4, name: str = "nsqcli-blocking", idle: float = 1.0):
        self.size, self.name, self.idle = size, name, idle
        self._cond = threading.Condition()
        self._work: deque = deque()
        self._threads = 0
        self._waiting = 0

    def submit(self, fn) -> None:
        with self._cond:
            self._work.append(fn)
            if self._waiting == 0 and self._threads < self.size:
                self._threads += 1
                threading.Thread(target=self._run, name=f"{self.name}-{self._threads}", daemon=True).start()
            else:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._work:
                    self._waiting += 1
                    woken = self._cond.wait(self.idle)
                    self._waiting -= 1
                    if not woken and not self._work:
                        self._threads -= 1
                        return
                fn = self._work.popleft()
            try:
                fn()
            except Exception as e:  # the callable reports its own errors
                log.error("background call failed: %s: %s", type(e).__name__, e)
                log.debug("traceback", exc_info=True)


class HandlerPool:
    """Handler threads fed ``(owner, handle, msgs)`` items, each run as ``owner.handle(handle,
    msgs)`` (a consumer's :class:`~nsqcli.client.handlers.Handlers`); started by the first
    consumer that uses the pool and stopped when the last one lets go."""

    def __init__(self, threads: int = 1, name: str = "nsqcli-handler", ordered: bool = False):
        """``ordered``: one consumer's batches are handled one after another, in the order they
        came (to-file: an archive keeps nsqd's order), while other consumers' run beside them."""
        self.size = max(1, threads)
        self.name = name
        self.ordered = ordered
        self._waiting: dict = {}  # ordered: consumer -> its batches not handled yet (while a thread has it)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._users = 0
        self._threads: list[threading.Thread] = []

    def acquire(self) -> None:
        with self._lock:
            self._users += 1
            if not self._threads:
                self._threads = [threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True)
                                 for i in range(self.size)]
                for t in self._threads:
                    t.start()

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0 or not self._threads:
                return
            threads, self._threads = self._threads, []
        for _ in threads:
            self.queue.put(None)
        for t in threads:
            if t is not threading.current_thread():
                t.join(5)

    def put(self, item) -> None:
        if not self.ordered:
            self.queue.put(item)
            return
        # ordered: the order is fixed here, as the batches come. A consumer with batches waiting
        # already has a thread on them (or one on its way); else one thread is asked to take it.
        # (Claimed by the thread that got the batch, two threads could take one consumer's batches
        # in the wrong order: the one with the first batch descheduled before it claimed it - an
        # archive's first message written after the next 199.)
        owner = item[0]
        with self._lock:
            waiting = self._waiting.get(owner)
            if waiting is not None:
                waiting.append(item)
                return
            self._waiting[owner] = collections.deque([item])
        self.queue.put(owner)

    def _run(self) -> None:
        get = self.queue.get
        while True:
            item = get()
            if item is None:
                return
            if not self.ordered:
                owner, handle, msgs = item
                owner.handle(handle, msgs)
                continue
            owner = item  # ordered: this consumer's batches, one after another, until none is left
            while True:
                with self._lock:
                    waiting = self._waiting[owner]
                    if not waiting:
                        del self._waiting[owner]
                        break
                    _, handle, msgs = waiting.popleft()
                owner.handle(handle, msgs)


TIMERS = Timers()
BLOCKING = Blocking(BLOCKING_THREADS)


def _after_fork() -> None:
    global TIMERS, BLOCKING
    TIMERS, BLOCKING = Timers(), Blocking(BLOCKING_THREADS)  # the parent's threads do not exist in the child


os.register_at_fork(after_in_child=_after_fork)
