"""Signals for work that must finish its bookkeeping before it stops (``mpub``, and the
daemons' clean stop: ``tail``, ``to-file``, ``to-nsq``, ``stat``).

A signal handler that raises can land between any two bytecodes: between writing a batch and
recording it, between counting an acknowledgement and dropping it from a queue. So the first
SIGINT/SIGTERM only sets an event, and the work stops at its next safe point and reports
exactly what it finished. The one exception is a read that may never return (stdin from a
quiet pipe, a handshake with a server that accepts and never answers): inside
:meth:`GracefulStop.blocking` the signal raises ``Interrupted`` there, where nothing has been
counted yet, and the command ends at once with 128 + the signal's number. A second signal
forces the exit (128 + its number) - after ``on_force``'s lines (mpub: what nsqd acknowledged
and the --skip that resumes), so a forced exit still says where to resume.

:meth:`GracefulStop.alarm` makes a deadline (``--timeout``) stop the work the same way: the
event is set (``expired`` says why) and a blocking read is interrupted.

A handler never sets the event itself (nsqcli.cli.setter says why): it posts it to SETTER.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from .app import Interrupted, forced_exit
from .setter import SETTER




class GracefulStop:
    """``event`` (a new one by default) is set by the first signal; ``signum`` says which."""

    def __init__(self, event: threading.Event | None = None):
        self.event = event if event is not None else threading.Event()
        self.signum: int | None = None
        self.expired = False  # the alarm (a deadline) stopped the work, not a signal
        #: lines (without "nsqcli: ") said before a forced exit; the last one follows "forced exit (SIG...): "
        self.on_force = None
        self._blocking = 0

    def install(self, signals=None) -> "GracefulStop":
        import signal

        SETTER.start()
        for sig in signals or (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not signal.SIG_IGN:  # a parent's `trap '' INT` / `&` job stands
                signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.signum is not None:  # (the event may also be set by the work itself: -n reached)
            self._force(signum)
        self.signum = signum
        SETTER.post(self.event)  # not self.event.set(): nsqcli.cli.setter
        if self._blocking:
            raise Interrupted(signum)

    def _force(self, signum: int) -> None:
        lines: list[str] = []
        try:
            if self.on_force is not None:
                lines = list(self.on_force())
        except BaseException:  # whatever it was doing, the exit must happen
            lines = []
        forced_exit(signum, lines)

    def alarm(self, deadline: float | None) -> "GracefulStop":
        """At ``deadline`` (time.monotonic()) stop the work as a first signal would, with
        ``expired`` set (SIGALRM; the caller cancels it with ``alarm(None)``)."""
        import signal
        import time

        if deadline is None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return self
        SETTER.start()
        signal.signal(signal.SIGALRM, self._alarm)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))
        return self

    def _alarm(self, signum, frame) -> None:
        if self.stopping:  # already stopping
            return
        self.expired = True
        SETTER.post(self.event)
        if self._blocking:
            raise Interrupted(signum)

    @property
    def stopping(self) -> bool:
        """A signal or the alarm came (the event may be set a moment later), or the work set
        the event itself."""
        return self.signum is not None or self.expired or self.event.is_set()

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
