"""Signals for work that must finish its bookkeeping before it stops (``mpub``, and the
daemons' clean stop: ``tail``, ``to-file``, ``to-nsq``, ``stat``).

A signal handler that raises can land between any two bytecodes: between writing a batch and
recording it, between counting an acknowledgement and dropping it from a queue. So the first
SIGINT/SIGTERM only sets an event, and the work stops at its next safe point and reports
exactly what it finished. The one exception is a read that may never return (stdin from a
quiet pipe, a handshake with a server that accepts and never answers): inside
:meth:`GracefulStop.blocking` the signal raises ``Interrupted`` there, where nothing has been
counted yet, and the command ends at once with 128 + the signal's number. A second signal forces the exit (130).
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

from .app import Interrupted


class GracefulStop:
    """``event`` (a new one by default) is set by the first signal; ``signum`` says which."""

    def __init__(self, event: threading.Event | None = None):
        self.event = event if event is not None else threading.Event()
        self.signum: int | None = None
        self._blocking = 0

    def install(self, signals=None) -> "GracefulStop":
        import signal

        for sig in signals or (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not signal.SIG_IGN:  # a parent's `trap '' INT` / `&` job stands
                signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.signum is not None:  # (the event may also be set by the work itself: -n reached)
            print("nsqcli: forced exit", file=sys.stderr, flush=True)
            os._exit(130)
        self.signum = signum
        self.event.set()
        if self._blocking:
            raise Interrupted(signum)

    @contextmanager
    def blocking(self):
        """A call that may block for ever (a read from a quiet pipe, a handshake with a server
        that never answers): a signal during it raises Interrupted."""
        self._blocking += 1
        try:
            if self.signum is not None:
                raise Interrupted(self.signum)
            yield
        finally:
            self._blocking -= 1
