"""A consumer's record of each of its connections (the Connection itself is the link's I/O
only): the responder attached to every message the connection delivers - it routes the
message's FIN/REQ/TOUCH back to that connection - and the consumer's counts for it (RDY
written, messages received, finished, requeued, lost, timed out), read by live tables through
:class:`ConnStats` snapshots."""

from __future__ import annotations

from .record import Record, field


class ConnStats(Record):
    """A snapshot of one connection for live tables (all counts since connect)."""

    address: str
    state: str
    rdy: int = 0
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0
    timed_out: int = 0
    last_message: float | None = None  # time.time()
    connected_at: float | None = None
    features: dict = field(default_factory=dict)
    backoff: str = ""
    lost: int = 0            # FIN/REQ not delivered (connection gone)
    late: int = 0            # messages that arrived after CLS, left for nsqd to redeliver


class Link:
    """One connection of a consumer. ``responses`` (nsqcli.client.responses.Responses) writes
    the answers; the counts are written by the I/O loop or under the consumer's lock."""

    __slots__ = ("conn", "responses", "address", "topic", "channel", "rdy", "received", "finished",
                 "requeued", "lost", "timed_out", "last_message")

    def __init__(self, conn, topic: str, channel: str, responses):
        self.conn = conn
        self.responses = responses
        self.address = conn.address
        self.topic = topic
        self.channel = channel
        self.rdy = 0              # the RDY last written to nsqd
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.lost = 0             # FIN/REQ that could not be written: the connection was gone
        self.timed_out = 0        # answers nsqd refused: the message had timed out (E_FIN_FAILED ...)
        self.last_message: float | None = None  # time.time() of the last recv batch

    def __repr__(self) -> str:  # flow control breaks ties by it: by address, as before
        return f"<Connection {self.address} {self.conn.state}>"

    # -- the responder of each message (nsqcli.client.message.Message) ----------------------------
    def finish(self, msg) -> None:
        self.responses.finish(self, msg)

    def requeue(self, msg, delay: float | None, backoff: bool) -> None:
        self.responses.requeue(self, msg, delay, backoff)

    def touch(self, msg) -> None:
        self.responses.touch(self, msg)

    def snapshot(self, backoff: str = "", in_flight: int = 0) -> ConnStats:
        """In-flight counts live in the consumer's flow control, which passes them in."""
        conn = self.conn
        return ConnStats(self.address, conn.state, self.rdy, in_flight, self.received, self.finished,
                         self.requeued, self.timed_out, self.last_message, conn.connected_at,
                         dict(conn.features), backoff, self.lost, conn.late_messages)
