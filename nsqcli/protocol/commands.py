"""Command encoders. Each returns the exact bytes to put on the wire.

Layouts (NSQ TCP protocol V2):

    IDENTIFY\\n[ 4-byte size ][ JSON ]
    AUTH\\n[ 4-byte size ][ secret ]
    SUB <topic> <channel>\\n
    PUB <topic>\\n[ 4-byte size ][ body ]
    MPUB <topic>\\n[ 4-byte body size ][ 4-byte count ][ 4-byte size ][ body ]...
    DPUB <topic> <defer_ms>\\n[ 4-byte size ][ body ]
    RDY <count>\\n        FIN <id>\\n        REQ <id> <timeout_ms>\\n
    TOUCH <id>\\n         CLS\\n             NOP\\n

All sizes are big-endian unsigned 32-bit integers.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable

from ..errors import LocalProtocolError
from .constants import MESSAGE_ID_SIZE
from .names import validate_channel, validate_topic

_U32 = struct.Struct(">I")
_pack_u32 = _U32.pack
MAX_U32 = 2**32 - 1
MAX_RDY = 2**31 - 1

CLS = b"CLS\n"
NOP = b"NOP\n"


def _body(body: bytes | bytearray | memoryview | str, what: str = "message body") -> bytes:
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif not isinstance(body, (bytes, bytearray, memoryview)):
        raise LocalProtocolError(f"{what} must be bytes or str, got {type(body).__name__}")
    if len(body) == 0:
        raise LocalProtocolError(f"{what} is empty (nsqd rejects empty messages)")
    return bytes(body)


def _msg_id(msg_id: bytes) -> bytes:
    if len(msg_id) != MESSAGE_ID_SIZE:
        raise LocalProtocolError(f"message id must be {MESSAGE_ID_SIZE} bytes, got {len(msg_id)}")
    return bytes(msg_id)


def _non_negative_int(value: int, what: str, maximum: int = MAX_U32) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LocalProtocolError(f"{what} must be an integer, got {value!r}")
    if not 0 <= value <= maximum:
        raise LocalProtocolError(f"{what} out of range: {value} (allowed 0..{maximum})")
    return value


def encode_identify(features: dict) -> bytes:
    """``IDENTIFY\\n[size][json]`` with the client's feature dict."""
    data = json.dumps(features, separators=(",", ":"), sort_keys=True).encode()
    return b"IDENTIFY\n" + _pack_u32(len(data)) + data


def encode_auth(secret: bytes | str) -> bytes:
    """``AUTH\\n[size][secret]``."""
    data = _body(secret, "auth secret")
    return b"AUTH\n" + _pack_u32(len(data)) + data


def encode_sub(topic: str, channel: str) -> bytes:
    """``SUB <topic> <channel>\\n``."""
    return b"SUB %s %s\n" % (validate_topic(topic).encode(), validate_channel(channel).encode())


def encode_pub(topic: str, body: bytes) -> bytes:
    """``PUB <topic>\\n[size][body]``."""
    data = _body(body)
    return b"PUB %s\n" % validate_topic(topic).encode() + _pack_u32(len(data)) + data


def encode_dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    """``DPUB <topic> <defer_ms>\\n[size][body]``."""
    defer_ms = _non_negative_int(defer_ms, "defer (ms)")
    data = _body(body)
    return (b"DPUB %s %d\n" % (validate_topic(topic).encode(), defer_ms)
            + _pack_u32(len(data)) + data)


class _SizePrefixes(dict):
    """size -> its 4-byte big-endian prefix, kept for the first few thousand sizes seen (a
    dict lookup, mapped in C, costs a third of packing each size in a Python loop)."""

    def __missing__(self, size: int) -> bytes:
        prefix = _pack_u32(size)
        if len(self) < 4096:
            self[size] = prefix
        return prefix


_size_prefix = _SizePrefixes().__getitem__


def _framed(head: bytes, bodies: list[bytes], lens: list[int] | None = None) -> bytes:
    """``head`` then ``[size][body]`` for each body, in one join (C-level passes only: no
    Python code runs per body); ``lens``: the bodies' lengths, when already known."""
    parts = [head] * (2 * len(bodies) + 1)
    parts[1::2] = map(_size_prefix, map(len, bodies) if lens is None else lens)
    parts[2::2] = bodies
    return b"".join(parts)


def mpub_body(bodies: Iterable[bytes]) -> bytes:
    """The MPUB payload after the body size: ``[count][size][body]...``.

    A list of non-empty ``bytes`` is checked and framed with C-level passes (type set,
    lengths, slice assignment); anything else goes body by body."""
    if type(bodies) is not list:
        bodies = list(bodies)
    n = len(bodies)
    if n and set(map(type, bodies)) == {bytes} and min(map(len, bodies)):
        return _framed(_pack_u32(n), bodies)
    parts = [b""]
    for body in bodies:
        data = _body(body, f"message {len(parts) // 2 + 1} of MPUB")
        parts.append(_pack_u32(len(data)))
        parts.append(data)
    if n == 0:
        raise LocalProtocolError("MPUB needs at least one message")
    parts[0] = _pack_u32(n)
    return b"".join(parts)


def encode_mpub_checked(topic: str, bodies: list[bytes], nbytes: int, lens: list[int] | None = None) -> bytes:
    """MPUB of bodies the caller has already checked - a valid topic, at least one body, each
    non-empty ``bytes`` - with ``nbytes`` = 4 + sum(4 + len(body)) and ``lens`` their
    lengths if known (the publisher's batches: its batching looked at every body once; this
    does not look again)."""
    return _framed(b"MPUB %s\n" % topic.encode() + _pack_u32(nbytes) + _pack_u32(len(bodies)), bodies, lens)


def encode_mpub(topic: str, bodies: Iterable[bytes]) -> bytes:
    """``MPUB <topic>\\n[body size][count]([size][body])*``."""
    payload = mpub_body(bodies)
    return b"MPUB %s\n" % validate_topic(topic).encode() + _pack_u32(len(payload)) + payload


def encode_mpub_framed(topic: str, count: int, framed) -> bytes:
    """MPUB from a payload that is already ``([size][body])*`` for ``count`` messages (what a
    columnar writer builds without a Python object per message)."""
    if count < 1:
        raise LocalProtocolError("MPUB needs at least one message")
    return (b"MPUB %s\n" % validate_topic(topic).encode() + _pack_u32(len(framed) + 4)
            + _pack_u32(count) + framed)


def split_framed(framed) -> list[bytes]:
    """The bodies of a ``([size][body])*`` payload (the inverse of the framing above)."""
    out, pos, data = [], 0, memoryview(framed)
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        out.append(bytes(data[pos + 4:pos + 4 + n]))
        pos += 4 + n
    if pos != len(data):
        raise LocalProtocolError("framed MPUB payload ends inside a message")
    return out


def mpub_size(bodies: list[bytes]) -> int:
    """The MPUB body size (what nsqd compares with --max-body-size) for these bodies."""
    return 4 + sum(4 + len(b) for b in bodies)


def encode_rdy(count: int) -> bytes:
    """``RDY <count>\\n``; count must be 0..2^31-1 (nsqd also caps it at its --max-rdy-count)."""
    return b"RDY %d\n" % _non_negative_int(count, "RDY count", MAX_RDY)


def encode_fin(msg_id: bytes) -> bytes:
    """``FIN <16-byte id>\\n``."""
    return b"FIN " + _msg_id(msg_id) + b"\n"


def encode_fins(msg_ids: list[bytes]) -> bytes:
    """Many ``FIN <id>\n`` in one buffer (b"" for none). The consumer's hot path: the ids are the
    ones nsqd sent (the frame decoder read exactly 16 bytes each), so they are not checked again,
    and the buffer is one join, not a concatenation per id."""
    return b"FIN " + b"\nFIN ".join(msg_ids) + b"\n" if msg_ids else b""


def encode_req(msg_id: bytes, timeout_ms: int = 0) -> bytes:
    """``REQ <16-byte id> <timeout_ms>\\n``."""
    return b"REQ %s %d\n" % (_msg_id(msg_id), _non_negative_int(timeout_ms, "requeue delay (ms)"))


def encode_touch(msg_id: bytes) -> bytes:
    """``TOUCH <16-byte id>\\n``."""
    return b"TOUCH " + _msg_id(msg_id) + b"\n"


def encode_cls() -> bytes:
    """``CLS\\n``: ask nsqd to stop sending; it answers CLOSE_WAIT."""
    return CLS


def encode_nop() -> bytes:
    """``NOP\\n``: the answer to a heartbeat."""
    return NOP
