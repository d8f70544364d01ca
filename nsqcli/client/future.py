"""Future: the answer nsqd will give to one publish, and Stopped: a wait for it ended by a stop
event. The connection that sent a publish resolves its future (nsqcli.client.conn); the
producer and publish_iter wait on it."""

from __future__ import annotations

import threading


class Future:
    """The answer nsqd will give to one command: ``result(timeout)`` returns the response bytes
    or raises the error. (A small stand-in for concurrent.futures.Future, whose import - with
    logging - costs ~9 ms of `nsqcli pub` start-up.)

    One lock, held until the answer is in: made, settled and waited for with a fraction of a
    threading.Event's work (an Event builds a Condition; its wait makes another lock), which
    is per batch on the publish path. The first settle wins."""

    __slots__ = ("_lock", "_done", "_result", "_error")

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._done = False
        self._result: bytes | None = None
        self._error: BaseException | None = None

    def set_result(self, data: bytes) -> None:
        self._settle(data, None)

    def set_exception(self, err: BaseException) -> None:
        self._settle(None, err)

    def _settle(self, data, err) -> None:
        with _SETTLE:
            if self._done:
                return
            self._result, self._error, self._done = data, err, True
        _release(self._lock)

    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        """True once settled; False if ``timeout`` seconds passed first."""
        if self._done:
            return True
        lock = self._lock
        try:
            if lock.acquire(True, -1 if timeout is None else max(0.0, timeout)):
                _release(lock)  # for any other waiter: once settled, the lock stays free
        finally:
            # a signal handler that raised (Ctrl-C) right after the acquire left the lock held:
            # every other waiter would wait for ever on a settled future
            if self._done and lock.locked():
                _release(lock)
        return self._done

    def exception(self) -> BaseException | None:
        """The error it was settled with (None: OK, or not settled yet)."""
        return self._error

    def result(self, timeout: float | None = None) -> bytes:
        if not self.wait(timeout):
            raise TimeoutError("no answer yet")
        if self._error is not None:
            raise self._error
        return self._result


_SETTLE = threading.Lock()


def _release(lock) -> None:
    """Free a settled future's lock; someone else may just have done so (a waiter passing it
    on, or one freeing what an interrupted waiter kept)."""
    try:
        lock.release()
    except RuntimeError:
        pass


class Stopped(Exception):
    """A stop event was set (Producer.stop, publish_iter's ``stop``): a wait for nsqd's answer
    ended, and publish_iter read its source no further."""

    def __init__(self):
        super().__init__("stopped")
