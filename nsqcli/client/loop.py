"""The I/O loops: a few threads, each running one selector over many connections.

A :class:`~nsqcli.client.conn.Connection` does its handshake, reads, heartbeats and queued
writes on the loop it was given (:func:`pick`), never on a thread of its own: a to-file over
40 nodes x 200 topics holds 2,000+ connections on one or two threads, one fd each (plus one
wake pipe per loop, not per connection).

What a loop does, per turn:

- ``select`` over its connections' sockets (read always; write while a connection has bytes
  the socket did not take) and its wake pipe, with a timeout no later than the next deadline
  check;
- the work other threads handed over: ``call(fn)`` (attach a connection, abort a handshake)
  and ``wake(conn)`` (send what a writer queued: every command queued between two wake-ups
  goes out in one ``send``) - before the reads, as a thread of its own would have;
- for each ready socket, ``conn._on_ready(readable, writable)``: one read (decoded,
  dispatched: heartbeats answered at once) or one non-blocking write;
- connections whose stream holds data ``select`` cannot see (TLS records, a decompressor's
  unused input) are read again without waiting;
- every ``SWEEP`` seconds, ``conn._sweep(now)`` for the connections with a deadline near
  (handshake, linger, a close, writes the peer stopped taking), every ``FULL_SWEEP`` seconds
  for all of them (reads that stopped: not even a heartbeat) - an idle connection costs a
  check a second, not ten.

Nothing on a loop may block: delegate callbacks and the code they call queue work and return.
The number of loops is ``NSQCLI_IO_THREADS`` (default 1: on CPython one thread decodes as
fast as several - the GIL - and handlers run elsewhere). Loop threads are daemons, started on
first use, and live for the process; after ``fork`` the child starts its own.
"""

from __future__ import annotations

import os
import selectors
import threading
import time

def _log():
    """The module's logger, imported when first needed: `nsqcli pub` never loads logging."""
    import logging

    return logging.getLogger("nsqcli.client.loop")

#: seconds between deadline checks of the connections that have one close (handshaking,
#: lingering, draining, closing, or holding bytes the socket did not take)
SWEEP = 0.1
#: seconds between checks of every connection (reads that stopped: tens of seconds)
FULL_SWEEP = 1.0


class IOLoop:
    """One selector thread. Every method except the ``call``/``wake`` pair is for the loop
    thread itself (the connections it drives)."""

    def __init__(self, name: str):
        self.name = name
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._calls: list = []
        self._dirty: dict = {}          # connections with queued writes (insertion-ordered set)
        self._signalled = False
        self.conns: set = set()         # attached connections (loop thread only)
        self.again: set = set()         # connections with data select() cannot see
        self.watched: set = set()       # connections with a deadline near (see SWEEP)
        self.load = 0                   # connections given this loop (any thread, under _POOL_LOCK)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    # -- any thread ----------------------------------------------------------------------------
    def call(self, fn) -> None:
        """Run ``fn()`` on the loop thread, soon."""
        with self._lock:
            self._calls.append(fn)
            self._signal()

    def wake(self, conn) -> None:
        """Have the loop send what ``conn`` queued."""
        with self._lock:
            self._dirty[conn] = None
            self._signal()

    def _signal(self) -> None:
        if not self._signalled:
            self._signalled = True
            try:
                os.write(self._wake_w, b"w")
            except BlockingIOError:  # the pipe is full: the loop is already woken
                pass

    @property
    def on_loop(self) -> bool:
        return threading.current_thread() is self.thread

    # -- the loop thread -----------------------------------------------------------------------
    def register(self, conn, fd: int, events: int) -> None:
        self.sel.register(fd, events, conn)
        self.conns.add(conn)
        self.watched.add(conn)

    def modify(self, fd: int, events: int, conn) -> None:
        self.sel.modify(fd, events, conn)

    def unregister(self, conn, fd: int) -> None:
        """Forget ``conn`` (before its fd is closed: a closed fd cannot be unregistered, and the
        OS may give its number to the next socket)."""
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass
        self.conns.discard(conn)
        self.again.discard(conn)
        self.watched.discard(conn)
        self._dirty.pop(conn, None)

    def _run(self) -> None:
        next_sweep = time.monotonic() + SWEEP
        next_full = time.monotonic() + FULL_SWEEP
        while True:
            timeout = 0.0 if self.again else max(0.0, next_sweep - time.monotonic())
            events = self.sel.select(timeout)
            if any(key.data is None for key, _ in events):  # drained before the hand-over is
                try:                                        # taken: a later wake-up stays
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            # what other threads handed over first: commands queued before a read are written
            # before it (a publish queued before nsqd's close counts as sent, then lost)
            with self._lock:
                calls, self._calls = self._calls, []
                dirty, self._dirty = self._dirty, {}
                self._signalled = False
            for fn in calls:
                _guarded(fn)
            for conn in dirty:
                _guarded(conn._on_wake)
            for key, mask in events:
                conn = key.data
                if conn is None:
                    continue
                self.again.discard(conn)
                _guarded(conn._on_ready, bool(mask & selectors.EVENT_READ), bool(mask & selectors.EVENT_WRITE))
            if self.again:
                for conn in list(self.again):
                    self.again.discard(conn)
                    if conn in self.conns:
                        _guarded(conn._on_ready, True, False)
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + SWEEP
                full = now >= next_full
                if full:
                    next_full = now + FULL_SWEEP
                for conn in list(self.conns if full else self.watched):
                    _guarded(conn._sweep, now)


def _guarded(fn, *args) -> None:
    """Connections catch their own errors; this is the net under a bug (or a callback that
    raised through them): logged, and the loop goes on serving every other connection."""
    try:
        fn(*args)
    except Exception as e:  # one line; the traceback at debug level (NSQCLI_DEBUG=1 / -vv)
        _log().error("I/O loop: unexpected %s: %s (the loop goes on)", type(e).__name__, e)
        _log().debug("traceback", exc_info=True)


_POOL_LOCK = threading.Lock()
_POOL: list[IOLoop] = []


def _size() -> int:
    try:
        return max(1, min(16, int(os.environ.get("NSQCLI_IO_THREADS", "1"))))
    except ValueError:
        return 1


def pick() -> IOLoop:
    """The least loaded of the process's loops (started on first use)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.extend(IOLoop(f"nsqcli-loop-{i}") for i in range(_size()))
        loop = min(_POOL, key=lambda lp: lp.load)
        loop.load += 1
        return loop


def release(loop: IOLoop) -> None:
    with _POOL_LOCK:
        loop.load -= 1


def connections() -> int:
    """Connections on the process's loops (handshakes included): one descriptor each."""
    return sum(lp.load for lp in _POOL)


def is_loop_thread() -> bool:
    """True on any I/O loop thread (where nothing may wait for a loop)."""
    t = threading.current_thread()
    return any(t is lp.thread for lp in _POOL)


def _after_fork() -> None:
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()
    _POOL.clear()  # the parent's loop threads do not exist in the child


os.register_at_fork(after_in_child=_after_fork)
