"""Setting a threading.Event from a signal handler, safely.

A handler runs in the main thread between two bytecodes, maybe inside ``event.wait()`` on the
very event it sets (the run harness's wait loop, stat's interval, the sandbox's loop), where
Event.wait holds the event's non-reentrant lock for a few bytecodes: ``event.set()`` there waits
for ever for a lock its own thread holds, and the command never stops (a to-http still running
30 s after SIGTERM, once in CI). So a handler posts the event to :data:`SETTER` (a deque and a
pipe: no lock) and SETTER's thread sets it, a moment later.
"""

from __future__ import annotations

import collections
import os
import threading


class Setter:
    """Sets events for signal handlers, from a thread of its own (one per process, started by
    the first install())."""

    def __init__(self):
        self._pending: collections.deque = collections.deque()
        self._w = -1
        self._pid = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """(not in a handler) The thread, once per process (again in a forked child)."""
        with self._lock:
            if self._pid == os.getpid():
                return
            r, self._w = os.pipe()
            os.set_blocking(self._w, False)
            self._pid = os.getpid()
            threading.Thread(target=self._run, args=(r,), name="nsqcli-signals", daemon=True).start()

    def post(self, event: threading.Event) -> None:
        """(in a signal handler) Have ``event`` set soon: takes no lock."""
        if self._pid != os.getpid():  # no thread in this process (never started, or a forked child)
            event.set()
            return
        self._pending.append(event)
        try:
            os.write(self._w, b"s")
        except BlockingIOError:  # the pipe is full: the thread is awake anyway
            pass

    def _run(self, r: int) -> None:
        import signal

        # the signals go to the main thread (where their handlers run), never to this one
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM})
        while True:
            os.read(r, 512)
            while self._pending:
                self._pending.popleft().set()


SETTER = Setter()
