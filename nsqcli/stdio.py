"""Standard streams a parent closed (``<&-``, ``>&-``, ``2>&-``): Python starts with
``sys.stdin``/``sys.stdout``/``sys.stderr`` None, and the first read or write was an internal
error (AttributeError) - or, for stderr, turned a usage error's exit 2 into 1. Called first by
the console script (nsqcli.entry) and by the one exit path (nsqcli.cli.app.run); stdlib only,
so `pub`'s fast path pays nothing for it."""

from __future__ import annotations

import os
import sys


def repair_closed_streams() -> None:
    """A closed stdin reads as empty (as /dev/null); a closed stdout is a pipe whose reader is
    gone, so a command ends as with ``| head -0`` (quietly, exit 0, after the work that needs no
    stdout); a closed stderr swallows what is said (the exit code still tells)."""
    if sys.stdin is None and _closed(0):
        _reopen(0, os.open(os.devnull, os.O_RDONLY))
        sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)
    if sys.stdout is None and _closed(1):
        r, w = os.pipe()  # fd 1 is free: one of the two may land on it
        _reopen(1, w)
        if r != 1:
            os.close(r)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    if sys.stderr is None and _closed(2):
        _reopen(2, os.open(os.devnull, os.O_WRONLY))
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)


def _reopen(target: int, fd: int) -> None:
    """Make ``target`` the descriptor ``fd`` (if the lowest free one was not ``target`` already)."""
    if fd != target:
        os.dup2(fd, target)  # if the other end of a pipe was ``target``, this closes it in the same step
        os.close(fd)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
        return False
    except OSError:
        return True


class ReadTimeout(TimeoutError):
    """The deadline passed before the end of input; ``read`` bytes had come."""

    def __init__(self, read: int):
        super().__init__(read)
        self.read = read

    @property
    def line(self) -> str:
        """pub's error line (both paths say the same)."""
        return (f"--timeout passed while reading the message from stdin ({self.read} bytes read, no end "
                "of input yet): nothing was published")


def read_all(stream, deadline: float | None) -> bytes:
    """All of a binary ``stream`` (stdin) up to its end, by ``deadline`` (time.monotonic();
    None: no limit). Raises ReadTimeout when the deadline passes first: a pipe whose writer
    never closes cannot hold a command with a --timeout."""
    if deadline is None:
        return stream.read()
    import select
    import time

    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file: nothing to wait on
        return stream.read()
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise ReadTimeout(size)
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
