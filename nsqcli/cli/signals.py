"""Signals for work that must finish its bookkeeping before it stops (``mpub``, and the
daemons' clean stop: ``tail``, ``to-file``, ``to-nsq``, ``stat``).

A signal handler that raises can land between any two bytecodes: between writing a batch and
recording it, between counting an acknowledgement and dropping it from a queue. So the first
SIGINT/SIGTERM only sets an event, and the work stops at its next safe point and reports
exactly what it finished. The one exception is a wait that may never end (stdin from a
quiet pipe, a handshake or a request to a server that accepts and never answers): there the
signal raises ``Interrupted``, where nothing has been counted yet, and the command ends at once
with 128 + the signal's number. A second signal forces the exit (128 + its number) - after
``on_force``'s lines (mpub: what nsqd acknowledged and the --skip that resumes), so a forced
exit still says where to resume.

Where it raises matters as much as when. An exception raised by a handler lands between two
bytecodes of whatever the main thread runs; in code that takes a lock (threading.Condition's
``__enter__`` and ``wait`` are Python code, and so is logging's) it can land after the lock
was taken and before the ``with`` that releases it was set up: the lock stays held, and the
next thread that wants it waits for ever (a to-file still running 30 s after SIGTERM: its
timer thread's lock taken by the main thread as a signal came, while starting a topic). So the
main thread is interruptible only where it runs nothing of ours:

- :meth:`GracefulStop.call` runs the work on a thread of its own (:class:`Call`) while the main
  thread waits on a bare lock, where the handler's exception leaves nothing held. The work
  goes on: the caller stops it (``Consumer.interrupt``) or lets the exit end it.
- :meth:`GracefulStop.blocking` is for one C call that takes no lock of ours (``os.read``,
  ``select``): the reads of mpub's input.

:meth:`GracefulStop.alarm` makes a deadline (``--timeout``) stop the work the same way: the
event is set (``expired`` says why) and a blocking read is interrupted.

A handler never sets the event itself (nsqcli.cli.setter says why): it posts it to SETTER.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from .app import Interrupted, forced_exit
from .setter import SETTER

#: how long the main thread waits on a Call's lock between two looks at it. A signal the kernel
#: gives the main thread (Linux: the thread group's leader first, when it does not block it)
#: cuts the wait short at once; one another thread took runs its handler at the next look.
WAIT_SLICE = 0.1


class Call:
    """``fn()`` on a thread of its own, for :meth:`GracefulStop.call` to wait for. The thread
    is a daemon: a call still running when the command exits does not hold the exit. (Its
    signal mask is the caller's: a thread born with the signals blocked would pass them
    blocked on to every thread it starts and every process they spawn - exec's COMMAND.)"""

    def __init__(self, fn, name: str = "nsqcli-call"):
        import _thread

        self.fn = fn
        self._gate = _thread.allocate_lock()  # held until fn has returned or raised
        self._gate.acquire()
        self._outcome: tuple | None = None    # (True, value) or (False, exception)
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._outcome = (True, self.fn())
        except BaseException as e:  # noqa: BLE001 - raised again by result(), in the waiting thread
            self._outcome = (False, e)
        finally:
            self._gate.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Until ``fn`` has returned or raised (True), or ``timeout`` seconds (False).

        Only a bare lock's acquire, in C: a signal handler that raises here leaves nothing held
        (at worst this one-shot lock, which no later wait needs once the outcome is there)."""
        if self._outcome is None and self._gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._gate.release()
        return self._outcome is not None

    def result(self):
        """What ``fn`` returned, or raise what it raised (once it is done)."""
        ok, value = self._outcome
        if not ok:
            raise value
        return value


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
        from ..exits import STOP_SIGNALS

        for sig in signals or STOP_SIGNALS:
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
        """Around ONE C call that may block for ever and takes no lock of ours (``os.read`` of
        a quiet pipe, ``select``): a signal during it raises Interrupted. Anything more (a
        handshake, a request, code that logs or takes a lock) goes through :meth:`call`. (Off the
        main thread it does nothing: the handler would raise in the main thread, wherever it is.)"""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._blocking += 1
        try:
            if self.signum is not None:
                raise Interrupted(self.signum)
            yield
        finally:
            self._blocking -= 1

    def wait_for(self, call: Call):
        """``call``'s result (or its exception); a signal (or the alarm) while waiting raises
        Interrupted here, and the call goes on in its thread."""
        if threading.current_thread() is not threading.main_thread():  # a handler raises in the main
            call.wait()                                                 # thread only: not from here
            return call.result()
        self._blocking += 1
        try:
            if self.signum is not None:
                raise Interrupted(self.signum)
            while not call.wait(WAIT_SLICE):
                pass
        finally:
            self._blocking -= 1
        return call.result()

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``; a signal meanwhile ends the sleep and raises Interrupted (after
        the wait, not inside it)."""
        self.event.wait(max(0.0, seconds))
        if self.signum is not None:
            raise Interrupted(self.signum)

    def call(self, fn, name: str = "nsqcli-call"):
        """``fn()``, run where a signal cannot land in it (a thread of its own): a signal
        meanwhile raises Interrupted here at once, and ``fn`` is left to end on its own (its
        deadline) or with the process."""
        return self.wait_for(Call(fn, name))
