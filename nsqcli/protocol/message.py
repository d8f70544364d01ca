"""The message frame payload.

    [ 8-byte timestamp (ns, signed) ][ 2-byte attempts (UNSIGNED) ][ 16-byte id ][ body ]
"""

from __future__ import annotations

import struct
from collections import namedtuple

from ..errors import RemoteProtocolError
from .constants import MESSAGE_HEADER_SIZE

MESSAGE_HEADER = struct.Struct(">qH16s")


MessageData = namedtuple("MessageData", ["id", "body", "timestamp", "attempts", "nsqd", "topic", "channel"])
MessageData.__doc__ = """A message as plain, picklable data (what crosses process boundaries, e.g. to Spark
executors): no connection, no responder. ``id`` + ``nsqd`` identify a delivery.

``id: str``, ``body: bytes``, ``timestamp: int`` (ns since the epoch, set by nsqd when the message
was published), ``attempts: int``, ``nsqd``, ``topic``, ``channel``: ``str | None``.
(collections.namedtuple: typing.NamedTuple would import typing, ~3 ms of `nsqcli pub`.)"""


class Message:
    """One NSQ message as the wire carries it: id, body, timestamp, attempts. Plain data; the
    client's Message (nsqcli.client.message) adds the responder beside it."""

    __slots__ = ("id", "body", "timestamp", "attempts")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int):
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(id={self.id!r}, attempts={self.attempts}, timestamp={self.timestamp}, "
                f"body={self.body[:40]!r}{'...' if len(self.body) > 40 else ''})")

    def encode(self) -> bytes:
        """The frame payload for this message (the inverse of :func:`decode_message`)."""
        return MESSAGE_HEADER.pack(self.timestamp, self.attempts, self.id) + self.body

    def data(self, nsqd: str | None = None, topic: str | None = None,
             channel: str | None = None) -> MessageData:
        """The plain-data value of this message (with where it came from, when known)."""
        return MessageData(self.id.decode("ascii", "replace"), self.body, self.timestamp,
                           self.attempts, nsqd, topic, channel)


def decode_message(payload: bytes | memoryview) -> Message:
    """Decode a message frame payload; raises RemoteProtocolError when it is too short."""
    if len(payload) < MESSAGE_HEADER_SIZE:
        raise RemoteProtocolError(
            f"message frame of {len(payload)} bytes is shorter than the {MESSAGE_HEADER_SIZE}-byte header")
    timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(payload)
    return Message(msg_id, bytes(payload[MESSAGE_HEADER_SIZE:]), timestamp, attempts)
