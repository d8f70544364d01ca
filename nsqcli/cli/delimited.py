"""Records from a byte stream split by one delimiter byte, read in large chunks (``mpub``'s input):
a quiet pipe is waited on where a signal may interrupt it, and records that waited ``--linger``
for more are let go."""

from __future__ import annotations

import contextlib
import time

CHUNK = 1 << 20


def read_groups(stream, delimiter: bytes, blocking=None, linger: float | None = None):
    """Yield the records split by one delimiter byte, as a list per chunk read (the producer
    takes a list whole: no Python work per record). A missing final delimiter keeps the last
    record whole (the official to_nsq drops its last byte). Empty records are kept as b"".
    ``blocking``: a context manager around each read (a signal may interrupt it there).
    ``linger`` (seconds): when records read have waited that long for more input (a pipe from
    ``tail -F``), the producer's FLUSH is yielded between lists (see :func:`read_chunks`)."""
    from ..client.publish_iter import FLUSH

    pending: list[bytes] = []  # the start of a record that continues in the next chunk
    for chunk in read_chunks(stream, blocking or contextlib.nullcontext, linger):
        if chunk is FLUSH:
            yield chunk
            continue
        if delimiter not in chunk:  # a record longer than a chunk: joined once, not re-copied per chunk
            pending.append(chunk)
            continue
        if pending:
            pending.append(chunk)
            chunk = b"".join(pending)
            pending = []
        parts = chunk.split(delimiter)
        rest = parts.pop()
        if rest:
            pending.append(rest)
        yield parts
    if pending:
        yield [b"".join(pending)]


def read_chunks(stream, blocking, linger: float | None):
    """The bytes of ``stream``, chunk by chunk, as soon as they are there (a slow pipe is not
    held back). With ``linger`` and a stream that has a file descriptor, FLUSH is yielded once
    ``linger`` seconds have passed since the first chunk after the last FLUSH - at once when
    input keeps coming, else when waiting for more input would pass that time (select on
    the descriptor: no thread, and a signal interrupts the wait as it does a read)."""
    from ..client.publish_iter import FLUSH

    fd = _fileno(stream) if linger is not None else None
    if fd is None:
        read = getattr(stream, "read1", stream.read)
        while True:
            with blocking():
                data = read(CHUNK)
            if not data:
                return
            yield data
    import os
    import select

    since = None  # when the first chunk not yet flushed was read
    while True:
        if since is not None:
            left = since + linger - time.monotonic()
            if left > 0:
                with blocking():
                    ready = select.select((fd,), (), (), left)[0]
            if left <= 0 or not ready:
                since = None
                yield FLUSH
                continue
        with blocking():
            data = os.read(fd, CHUNK)
        if not data:
            return
        if since is None:
            since = time.monotonic()
        yield data


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.BytesIO (tests), a wrapped stream
        return None
