"""systemd's service notification protocol (sd_notify(3)), stdlib only, no thread of its own.

With ``Type=notify`` systemd puts the path of a datagram socket in ``NOTIFY_SOCKET`` and waits
for ``READY=1``; ``WatchdogSec=`` adds ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``) and restarts a
service that stops sending ``WATCHDOG=1``. The run harness uses it so::

    notifier = Notifier.from_env()          # None: not started by systemd (or no Type=notify)
    notifier.ready("archiving 3 topics")    # once subscribed
    notifier.status("1,204 msg/s, lag 12")  # each status interval, one short line
    notifier.watchdog()                     # from the wait loop, every watchdog_interval() s
    notifier.stopping("draining")           # on SIGTERM/SIGINT
    notifier.reloading(); ...; notifier.ready()   # around a SIGHUP (ExecReload)

Sending never raises: a systemd that went away (or a NOTIFY_SOCKET nothing listens on) must
not stop the daemon. Failures are counted in ``errors`` and the newest is in ``last_error``
(the harness may log it once). A send never waits more than ``SEND_WAIT`` seconds for room in
systemd's queue, and after one such wait the next sends do not wait at all until one
succeeds: a stuck receiver cannot hold the wait loop.

Addresses: an absolute path, or ``@name`` for a Linux abstract socket (systemd uses both).
Other forms (``vsock:``) are refused on every send with a ``last_error`` saying so.

The environment is left as it is (sd_notify's ``unset_environment`` is false): to-file's
hand-off exec()s itself and the new image must find ``NOTIFY_SOCKET`` again (same pid, so
``NotifyAccess=main`` still accepts it). Children that are not the main process are refused by
systemd under ``NotifyAccess=main`` anyway; ``from_env(..., unset=True)`` removes the variables
for a caller that wants it.
"""

from __future__ import annotations

import os
import socket
import threading
import time

#: seconds a send may wait for room in systemd's queue
SEND_WAIT = 0.25

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _one_line(text: str) -> str:
    """A STATUS= value: one line (a newline would start another assignment)."""
    return " ".join(str(text).split())


class Notifier:
    """Sends notifications to the socket ``address`` (a path or ``@abstract``)."""

    def __init__(self, address: str, watchdog_usec: str | None = None, watchdog_pid: str | None = None):
        self.address = address
        self._watchdog_usec = watchdog_usec
        self._watchdog_pid = watchdog_pid
        self.sent = 0            # datagrams systemd's socket took
        self.errors = 0          # sends that failed (counted, never raised)
        self.last_error = ""     # the newest failure, one line
        self._sock: socket.socket | None = None
        self._congested = False  # the last send waited SEND_WAIT in vain: do not wait again
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ=None, unset: bool = False) -> "Notifier | None":
        """A Notifier for ``environ``'s NOTIFY_SOCKET (default os.environ); None when it is
        unset or empty. ``unset``: remove NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID from
        ``environ`` (off by default, see the module's note)."""
        environ = os.environ if environ is None else environ
        address = environ.get("NOTIFY_SOCKET") or ""
        notifier = cls(address, environ.get("WATCHDOG_USEC"), environ.get("WATCHDOG_PID")) if address else None
        if unset:
            for name in _VARIABLES:
                environ.pop(name, None)
        return notifier

    # -- what the harness calls -------------------------------------------------------------------
    def ready(self, status: str = "") -> bool:
        """READY=1 (startup finished: subscribed), with a STATUS= line and MAINPID=."""
        fields = ["READY=1"] + ([f"STATUS={_one_line(status)}"] if status else []) + [f"MAINPID={os.getpid()}"]
        return self.send(*fields)

    def status(self, text: str) -> bool:
        """STATUS=: the one line `systemctl status` shows."""
        return self.send(f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        """WATCHDOG=1: the loop is alive. Call every watchdog_interval() seconds."""
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        """STOPPING=1: shutting down (draining); optionally a STATUS= line."""
        return self.send("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def reloading(self, status: str = "") -> bool:
        """RELOADING=1 with MONOTONIC_USEC= (systemd >= 253 needs both for Type=notify-reload;
        older ones ignore them). Send ready() when the reload (SIGHUP) is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}",
                         *([f"STATUS={_one_line(status)}"] if status else []))

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC=: ask for ``seconds`` more before the start/stop timeout
        (TimeoutStartSec/TimeoutStopSec) kills the service, e.g. during a long drain."""
        return self.send(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1_000_000))}")

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half of WATCHDOG_USEC (systemd's advice), or None
        when there is no watchdog for this process (WATCHDOG_USEC unset, not a positive
        integer, or WATCHDOG_PID set to another pid)."""
        try:
            usec = int(self._watchdog_usec or "")
        except ValueError:
            return None
        if usec <= 0:
            return None
        if self._watchdog_pid:
            try:
                if int(self._watchdog_pid) != os.getpid():
                    return None
            except ValueError:
                return None
        return usec / 2 / 1_000_000

    # -- the socket -------------------------------------------------------------------------------
    def _target(self):
        if self.address.startswith("@"):
            return b"\0" + os.fsencode(self.address[1:])
        if self.address.startswith("/"):
            return os.fsencode(self.address)
        raise OSError(f"NOTIFY_SOCKET {self.address!r} is not a socket path or @abstract name "
                      "(only those are supported)")

    def send(self, *fields: str) -> bool:
        """Send ``fields`` as one datagram (newline-separated); True when the socket took it.
        Never raises."""
        data = "\n".join(fields).encode()
        with self._lock:
            try:
                if self._sock is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # close-on-exec
                    try:
                        sock.connect(self._target())  # connected: poll waits for room at the receiver
                    except BaseException:
                        sock.close()
                        raise
                    self._sock = sock
                self._sock.settimeout(0.0 if self._congested else SEND_WAIT)
                self._sock.send(data)
            except (OSError, ValueError) as e:
                self.errors += 1
                self._congested = isinstance(e, (TimeoutError, BlockingIOError))
                what = "systemd's queue stayed full" if self._congested else (e.strerror or str(e))
                self.last_error = f"sd_notify to {self.address}: {what}"
                if not self._congested and self._sock is not None:
                    self._sock.close()  # a systemd that came back has a new socket: connect again
                    self._sock = None
                return False
            self._congested = False
            self.sent += 1
            return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __repr__(self) -> str:
        return f"Notifier({self.address!r}, sent={self.sent}, errors={self.errors})"
