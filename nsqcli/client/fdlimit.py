"""The process's open-file limit: every connection costs one descriptor (its socket).

Long-running commands call :func:`raise_soft_limit` at start (as Go programs do: the soft
``RLIMIT_NOFILE`` goes up to the hard one), and a connection that cannot be opened for want
of descriptors is said once, in one line, with what to do - never an abort: the connections
that fit keep working, and the rest are tried again later.
"""

from __future__ import annotations

import errno
import os
import threading

#: a hard limit of "unlimited" is read as this many (what Linux's nr_open allows by default)
UNLIMITED_AS = 1 << 20

#: descriptors kept free for everything that is not a connection (stdio, logs, the loops'
#: selector and wake pipe, HTTP requests to lookupd)
HEADROOM = 32

_said = threading.Lock()
_told = False
_soft: int | None = None   # the soft limit as last read or set
_reserved = 0              # descriptors promised to other users (to-file: one file per topic)


def raise_soft_limit() -> tuple[int, int] | None:
    """Raise the soft limit on open files to the hard one. Returns (soft, hard) as they are
    now; None where the platform has no such limit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = UNLIMITED_AS if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    global _soft
    _soft = None if soft == resource.RLIM_INFINITY else soft
    return soft, hard


def reserve(n: int) -> None:
    """Keep ``n`` more descriptors (negative: fewer) free of connections."""
    global _reserved
    with _said:
        _reserved += n


def room_for_connection(connections: int) -> bool:
    """Whether one more connection fits beside ``connections`` open ones, the reserved
    descriptors and HEADROOM (False: treat it as out of descriptors - say so, try later)."""
    global _soft
    if _soft is None:
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            _soft = UNLIMITED_AS if soft == resource.RLIM_INFINITY else soft
        except ImportError:
            return True
    return connections + 1 + _reserved + HEADROOM <= _soft


def out_of_descriptors(err: BaseException) -> bool:
    """The error is EMFILE/ENFILE (the process or the system is out of file descriptors)."""
    return getattr(err, "errno", None) in (errno.EMFILE, errno.ENFILE)


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def first_time() -> bool:
    """True once per process: the out-of-descriptors line is said once, not per attempt."""
    global _told
    with _said:
        told, _told = _told, True
        return not told


def advice() -> str:
    """One line: how many descriptors are open, the limit, and what to do."""
    try:
        import resource

        limit = str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except ImportError:
        limit = "unknown"
    return (f"out of file descriptors: {open_descriptors()} open, limit {limit} - connections that fit keep "
            f"working, the others are tried again later (raise the limit: ulimit -n, or LimitNOFILE= in a "
            f"systemd unit)")
