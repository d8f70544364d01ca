"""The Message a consumer hands out: the protocol's plain message plus, beside it, the responder
(the consumer's handle on the connection it came from), so that ``finish()``, ``requeue()`` and
``touch()`` work. It pickles as plain MessageData: a connection cannot cross a process boundary."""

from __future__ import annotations

from ..protocol.message import Message as WireMessage
from ..protocol.message import MessageData


class Message(WireMessage):
    __slots__ = ("responder", "responded", "auto_response")

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

    def data(self, nsqd: str | None = None, topic: str | None = None,
             channel: str | None = None) -> MessageData:
        """The plain-data value of this message: id, body, timestamp, attempts, nsqd, topic, channel."""
        return WireMessage.data(self, nsqd or self.nsqd, topic or self.topic, channel or self.channel)

    def __reduce__(self):
        return (MessageData, tuple(self.data()))

    # -- responses ---------------------------------------------------------------------------
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
