"""The message frame payload.

    [ 8-byte timestamp (ns, signed) ][ 2-byte attempts (UNSIGNED) ][ 16-byte id ][ body ]
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import RemoteProtocolError
from .constants import MESSAGE_HEADER_SIZE

MESSAGE_HEADER = struct.Struct(">qH16s")


class MessageData(NamedTuple):
    """A message as plain, picklable data (what crosses process boundaries, e.g. to Spark
    executors): no connection, no responder. ``id`` + ``nsqd`` identify a delivery."""

    id: str
    body: bytes
    timestamp: int      # ns since the epoch, set by nsqd when the message was published
    attempts: int
    nsqd: str | None
    topic: str | None
    channel: str | None


class Message:
    """One NSQ message. The protocol layer fills the data fields; the consumer attaches a
    responder so that ``finish()``, ``requeue()`` and ``touch()`` work (see nsqcli.client.consumer)."""

    __slots__ = ("id", "body", "timestamp", "attempts", "responder", "responded", "auto_response")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int, responder=None):
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.responder = responder
        self.responded = False
        self.auto_response = True

    @property
    def nsqd(self) -> str | None:
        """host:port of the nsqd that delivered this message (None when detached)."""
        return getattr(self.responder, "address", None)

    @property
    def topic(self) -> str | None:
        return getattr(self.responder, "topic", None)

    @property
    def channel(self) -> str | None:
        return getattr(self.responder, "channel", None)

    def __repr__(self) -> str:
        return (f"Message(id={self.id!r}, attempts={self.attempts}, timestamp={self.timestamp}, "
                f"body={self.body[:40]!r}{'...' if len(self.body) > 40 else ''})")

    def data(self) -> MessageData:
        """The plain-data value of this message (the responder stays behind)."""
        return MessageData(self.id.decode("ascii", "replace"), self.body, self.timestamp,
                           self.attempts, self.nsqd, self.topic, self.channel)

    def __reduce__(self):
        # a Message pickles as its plain data: a connection cannot cross a process boundary
        return (MessageData, tuple(self.data()))

    def encode(self) -> bytes:
        """The frame payload for this message (the inverse of :func:`decode_message`)."""
        return MESSAGE_HEADER.pack(self.timestamp, self.attempts, self.id) + self.body

    # -- responses (need a responder, attached by the consumer) --------------------------
    def _responder(self):
        if self.responder is None:
            raise RuntimeError("this message is not attached to a consumer connection")
        if self.responded:
            raise RuntimeError(f"message {self.id.decode(errors='replace')} was already responded to")
        self.responded = True
        return self.responder

    def finish(self) -> None:
        """FIN: the message is done."""
        self._responder().finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: give the message back to nsqd, redelivered after ``delay`` seconds
        (default: attempts x default_requeue_delay, capped). ``backoff=False`` requeues
        without slowing the consumer down."""
        self._responder().requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset the server-side timeout of this in-flight message."""
        if self.responder is None:
            raise RuntimeError("this message is not attached to a consumer connection")
        if not self.responded:
            self.responder.touch(self)

    def disable_auto_response(self) -> None:
        """The handler will call finish()/requeue() itself, maybe later and from another thread."""
        self.auto_response = False


def decode_message(payload: bytes | memoryview) -> Message:
    """Decode a message frame payload; raises RemoteProtocolError when it is too short."""
    if len(payload) < MESSAGE_HEADER_SIZE:
        raise RemoteProtocolError(
            f"message frame of {len(payload)} bytes is shorter than the {MESSAGE_HEADER_SIZE}-byte header")
    timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(payload)
    return Message(msg_id, bytes(payload[MESSAGE_HEADER_SIZE:]), timestamp, attempts)
