"""Incremental frame decoder.

    [ 4-byte size ][ 4-byte frame type ][ data (size - 4 bytes) ]

Feed bytes with :meth:`FrameDecoder.receive_data` in any split; take frames with
:meth:`next_frame` (returns ``NEED_DATA`` until a whole frame is buffered) or, on the hot
path, :meth:`decode_all` (every complete frame at once, message frames already decoded,
one buffer compaction per call). Sizes are checked before anything is allocated.
"""

from __future__ import annotations

import struct
from collections import namedtuple

from ..errors import RemoteProtocolError
from .constants import (DEFAULT_MAX_FRAME_SIZE, FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE,
                        MESSAGE_HEADER_SIZE)
from .message import plain_message

_HEADER = struct.Struct(">lL")
_MSG = struct.Struct(">lLqH16s")
_FRAME_TYPES = (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE)


#: one frame: ``type`` (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE) and its ``data`` bytes.
#: (collections.namedtuple: typing.NamedTuple would import typing, ~3 ms of `nsqcli pub`.)
Frame = namedtuple("Frame", ["type", "data"])


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()


class FrameDecoder:
    """Turns a byte stream into frames. Pure: no I/O, no clocks."""

    __slots__ = ("_buf", "max_frame_size", "_error")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self._buf = bytearray()
        self.max_frame_size = max_frame_size
        self._error: RemoteProtocolError | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf)

    @property
    def error(self) -> RemoteProtocolError | None:
        """Set once garbage was found (decode_all hands over the good frames before it first;
        the caller raises this after dispatching them, without waiting for more data)."""
        return self._error

    def take_buffered(self) -> bytes:
        """Remove and return the undecoded bytes (used when a compression upgrade starts:
        bytes after the last frame belong to the compressed stream)."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def _check(self, size: int, ftype: int, off: int = 0) -> None:
        if size < 4 or size > self.max_frame_size:
            head = bytes(self._buf[off:off + 4])
            hint = (" - this looks like an HTTP server; use nsqd's TCP port (4150)"
                    if head[:4] in (b"HTTP", b"<htm", b"<!DO") else " - is this an nsqd TCP port?")
            self._error = RemoteProtocolError(
                f"invalid frame size {size} (allowed 4..{self.max_frame_size}){hint}")
        elif ftype not in _FRAME_TYPES:
            self._error = RemoteProtocolError(f"unknown frame type {ftype} - is this an nsqd TCP port?")
        elif ftype == FRAME_MESSAGE and size - 4 < MESSAGE_HEADER_SIZE:
            self._error = RemoteProtocolError(
                f"message frame of {size - 4} bytes is shorter than the {MESSAGE_HEADER_SIZE}-byte header")
        if self._error is not None:
            raise self._error

    def next_frame(self) -> Frame | _NeedData:
        """The next complete frame, or NEED_DATA. Raises RemoteProtocolError on garbage."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        if len(buf) < 8:
            return NEED_DATA
        size, ftype = _HEADER.unpack_from(buf)
        self._check(size, ftype)
        end = 4 + size
        if len(buf) < end:
            return NEED_DATA
        data = bytes(buf[8:end])
        del buf[:end]
        return Frame(ftype, data)

    def decode_all(self, responder=None, message=plain_message) -> list:
        """Every complete frame buffered: messages for message frames, built by
        ``message(id, body, timestamp, attempts, responder)`` (default: the plain protocol
        Message; the client passes its own class, which keeps ``responder`` beside the data),
        ``Frame`` for responses and errors. The buffer is compacted once at the end (hot path:
        one struct unpack per message)."""
        if self._error is not None:
            raise self._error
        n = len(self._buf)
        if n < 8:
            return []
        size, ftype = _HEADER.unpack_from(self._buf)
        if n < 4 + size:  # not one whole frame yet (a big one arriving in pieces is not copied)
            self._check(size, ftype)  # unless it is garbage
            return []
        # one copy of the buffer as bytes, then each body is one slice (a bytearray slice is a
        # bytearray: bytes() of it copied every body twice, ~250 ns a message)
        buf = bytes(self._buf)
        off = 0
        out = []
        append = out.append
        unpack_header = _HEADER.unpack_from
        unpack_msg = _MSG.unpack_from
        max_size = self.max_frame_size
        min_size = MESSAGE_HEADER_SIZE + 4
        try:
            while n - off >= 8:
                if n - off >= 34:  # one unpack gives a message's whole header
                    size, ftype, ts, attempts, msg_id = unpack_msg(buf, off)
                else:
                    size, ftype = unpack_header(buf, off)
                end = off + 4 + size
                if ftype == FRAME_MESSAGE and min_size <= size <= max_size:
                    if end > n:
                        break
                    if n - off < 34:  # pragma: no cover - a complete message is >= 34 bytes
                        break
                    append(message(msg_id, buf[off + 34:end], ts, attempts, responder))
                else:
                    self._check(size, ftype, off)
                    if end > n:
                        break
                    append(Frame(ftype, buf[off + 8:end]))
                off = end
        except RemoteProtocolError:
            if not out:
                raise  # otherwise hand over the good frames; the next call raises
        finally:
            if off:
                del self._buf[:off]
        return out
