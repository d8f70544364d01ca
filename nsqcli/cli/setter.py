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
import signal
import threading

#: the signals whose handlers post here: SETTER's thread never takes them (born with them blocked)
_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM}


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
            r, w = os.pipe()
            os.set_blocking(w, False)
            old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # inherited by the thread from birth
            try:
                threading.Thread(target=self._run, args=(r,), name="nsqcli-signals", daemon=True).start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            # only once the thread runs: a start that failed ("can't start new thread", a
            # KeyboardInterrupt in an embedding) leaves post() setting events itself, not posting
            # them to a thread that does not exist (the event would never be set)
            self._w, self._pid = w, os.getpid()

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
        # (born with _SIGNALS blocked: they go to the main thread, where their handlers run)
        while True:
            os.read(r, 512)
            while self._pending:
                self._pending.popleft().set()


SETTER = Setter()
