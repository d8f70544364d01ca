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
from .message import Message

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
    """Turns a byte stream into frames. Pure: no I/O, no clocks.

    Received chunks are kept as they came and joined only when a whole frame may be there
    (a recv that holds only whole frames is decoded in place, without a copy; a big frame
    arriving in pieces is joined once, when it is complete)."""

    __slots__ = ("_chunks", "_pos", "_size", "_need", "max_frame_size", "_error")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self._chunks: list[bytes] = []
        self._pos = 0     # bytes of _chunks[0] already returned
        self._size = 0    # bytes in _chunks not returned yet
        self._need = 8    # no whole frame before this many bytes
        self.max_frame_size = max_frame_size
        self._error: RemoteProtocolError | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            if type(data) is not bytes:
                data = bytes(data)  # (a memoryview's len counts items, not bytes)
            self._chunks.append(data)
            self._size += len(data)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return self._size

    @property
    def error(self) -> RemoteProtocolError | None:
        """Set once garbage was found (decode_all hands over the good frames before it first;
        the caller raises this after dispatching them, without waiting for more data)."""
        return self._error

    def _joined(self) -> tuple[bytes, int]:
        """(one buffer holding everything not returned, where that starts in it)."""
        chunks, pos = self._chunks, self._pos
        if len(chunks) > 1:
            first = memoryview(chunks[0])[pos:] if pos else chunks[0]
            chunks[:] = [b"".join([first, *chunks[1:]])]
            self._pos = pos = 0
        return (chunks[0], pos) if chunks else (b"", 0)

    def _keep(self, buf: bytes, off: int) -> None:
        """Everything in ``buf`` before ``off`` was returned. The rest is kept in place (no
        copy) while it is the larger part, copied once it is the smaller: a buffer of many
        frames taken one next_frame() at a time is not copied again for every frame, and a
        small partial frame does not keep a big read alive."""
        left = len(buf) - off
        if left <= 0:
            self._chunks, self._pos = [], 0
        elif left < off:
            self._chunks, self._pos = [buf[off:]], 0
        else:
            self._chunks, self._pos = [buf], off
        self._size = max(0, left)
        self._need = 8

    def take_buffered(self) -> bytes:
        """Remove and return the undecoded bytes (used when a compression upgrade starts:
        bytes after the last frame belong to the compressed stream)."""
        buf, pos = self._joined()
        self._keep(b"", 0)
        return buf[pos:] if pos else buf

    def _check(self, size: int, ftype: int, buf: bytes, off: int = 0) -> None:
        if size < 4 or size > self.max_frame_size:
            head = buf[off:off + 4]
            hint = (" - this looks like an HTTP server; use nsqd's TCP port (4150)"
                    if head in (b"HTTP", b"<htm", b"<!DO") else " - is this an nsqd TCP port?")
            self._error = RemoteProtocolError(
                f"invalid frame size {size} (allowed 4..{self.max_frame_size}){hint}")
        elif ftype not in _FRAME_TYPES:
            self._error = RemoteProtocolError(f"unknown frame type {ftype} - is this an nsqd TCP port?")
        elif ftype == FRAME_MESSAGE and size - 4 < MESSAGE_HEADER_SIZE:
            self._error = RemoteProtocolError(
                f"message frame of {size - 4} bytes is shorter than the {MESSAGE_HEADER_SIZE}-byte header")
        if self._error is not None:
            raise self._error

    def _first(self) -> tuple[bytes, int] | None:
        """(the buffer, joined, and where the unreturned bytes start) when it may hold a whole
        frame; None when it cannot (its header says more bytes are needed: nothing is joined or
        copied until they are)."""
        if self._error is not None:
            raise self._error
        if self._size < self._need:
            return None
        buf, pos = self._joined()
        size, ftype = _HEADER.unpack_from(buf, pos)
        self._check(size, ftype, buf, pos)
        if len(buf) - pos < 4 + size:
            self._need = 4 + size
            return None
        return buf, pos

    def next_frame(self) -> Frame | _NeedData:
        """The next complete frame, or NEED_DATA. Raises RemoteProtocolError on garbage."""
        first = self._first()
        if first is None:
            return NEED_DATA
        buf, pos = first
        size, ftype = _HEADER.unpack_from(buf, pos)
        self._keep(buf, pos + 4 + size)
        return Frame(ftype, buf[pos + 8:pos + 4 + size])

    def decode_all(self, responder=None, message=Message) -> list:
        """Every complete frame buffered, in order: ``message`` instances for message frames
        (see :meth:`decode`), ``Frame`` for responses and errors."""
        out: list = []
        self._decode(out, out, responder, message)
        return out

    def decode(self, responder=None, message=Message) -> tuple[list, list, int]:
        """The hot path: every complete frame buffered as ``(messages, other frames, bytes of
        the messages' bodies)``, each list in order.

        ``message`` is a class: the protocol Message or a subclass (not a factory function).
        Instances are made with ``object.__new__`` and their slots set here, not through
        ``__init__`` (a class call running a Python ``__init__`` costs several times the slot
        stores, once per message). A class with a ``responder`` attribute (the
        client's Message) also gets ``responder``, ``responded=False`` and
        ``auto_response=True``: the handle on the connection it came from, beside the data.
        The body bytes come from the frame sizes, which are at hand, instead of a second pass
        summing len(body) over the list."""
        msgs: list = []
        frames: list = []
        nbytes = self._decode(msgs, frames, responder, message)
        return msgs, frames, nbytes

    def _decode(self, msgs: list, frames: list, responder, message) -> int:
        """Append messages to ``msgs`` and other frames to ``frames`` (the same list for
        decode_all); returns the bytes of the message bodies appended."""
        got = self._first()
        if got is None:
            return 0
        buf, off = got
        start = off
        n = len(buf)
        first = len(msgs)
        nframes = framed = 0  # other frames appended, and their bytes on the wire
        append = msgs.append
        unpack_header = _HEADER.unpack_from
        unpack_msg = _MSG.unpack_from
        max_size = self.max_frame_size
        min_size = MESSAGE_HEADER_SIZE + 4
        new = object.__new__
        attach = getattr(message, "responder", None) is not None  # a slot: the client's Message
        try:
            while True:
                while n - off >= 34:  # whole message frames: one unpack gives the header
                    size, ftype, ts, attempts, msg_id = unpack_msg(buf, off)
                    end = off + 4 + size
                    if ftype != FRAME_MESSAGE or end > n or size < min_size or size > max_size:
                        break
                    m = new(message)
                    m.id = msg_id
                    m.body = buf[off + 34:end]
                    m.timestamp = ts
                    m.attempts = attempts
                    if attach:
                        m.responder = responder
                        m.responded = False
                        m.auto_response = True
                    append(m)
                    off = end
                # anything else: a response or error frame, a partial frame, or garbage
                if n - off < 8:
                    break
                size, ftype = unpack_header(buf, off)
                self._check(size, ftype, buf, off)
                end = off + 4 + size
                if end > n or ftype == FRAME_MESSAGE:  # (a whole message frame was taken above)
                    break
                frames.append(Frame(ftype, buf[off + 8:end]))
                nframes += 1
                framed += end - off
                off = end
        except RemoteProtocolError:
            if len(msgs) == first and not nframes:
                raise  # otherwise hand over the good frames; the next call raises
        finally:
            self._keep(buf, off)
        nmsgs = len(msgs) - first - (nframes if msgs is frames else 0)
        return off - start - framed - 34 * nmsgs
