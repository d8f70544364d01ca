"""One NSQ connection as a pure state machine (h11's Connection is the model): the handshake,
then the commands and their answers. No sockets, threads or clocks.

    magic "  V2" + IDENTIFY  ->  IDENTIFY reply (OK, or JSON with the negotiated features)
    [TLS upgrade]            ->  OK (read over TLS)
    [snappy | deflate]       ->  OK (read through the decompressor)
    [AUTH <secret>]          ->  JSON {identity, identity_url, permission_count}
    [SUB <topic> <channel>]  ->  OK
    READY

The caller owns the socket: it sends what :meth:`Handshake.start` returns, feeds every frame
to :meth:`Handshake.receive_frame`, and carries out the actions that come back (bytes to send,
``Upgrade`` to perform). Everything nsqd says is checked here: wrong types in the IDENTIFY
reply, a feature that was not asked for, anything but OK where OK is due. Heartbeats during the
handshake are answered with NOP.

After the handshake, :class:`Session` is the connection's protocol state: commands go in
through :meth:`Session.send` (a publish with the token that will receive its answer), frames
come back through :meth:`Session.receive` and turn into events. nsqd answers the commands of
one connection in order, so PUB/MPUB/DPUB are matched to OK or E_* here, in one FIFO that
belongs to this connection alone:

    send(PUB|MPUB|DPUB, token)  ->  token queued; flushed() when its bytes are written
    OK                          ->  Answered(token, None)           (published; only a written
                                    publish can be answered)
    E_* (fatal)                 ->  Answered(head, error), then Unanswered(t, NOT_PROCESSED)
                                    for every later token: nsqd closes the connection without
                                    reading them, so they were certainly not published
    connection_lost()           ->  Unanswered(t, UNKNOWN) for every written token still
                                    waiting (nsqd may or may not have published those),
                                    NOT_PROCESSED for those never written
    _heartbeat_                 ->  NOP queued (data_to_send), counted
    CLS / CLOSE_WAIT            ->  state CLOSING, CloseWait event
    E_FIN_FAILED & co.          ->  ServerErrorEvent (non-fatal; never the answer to a publish)
    a message frame             ->  passed through; RemoteProtocolError unless subscribed
"""

from __future__ import annotations

import collections
import json

from ..errors import AuthError, ConnectError, LocalProtocolError, RemoteProtocolError, server_error
from .commands import CLS, NOP, encode_auth, encode_identify, encode_sub
from .frames import Frame
from .constants import CLOSE_WAIT, DEFAULT_MAX_RDY_COUNT, FRAME_ERROR, FRAME_MESSAGE, HEARTBEAT, MAGIC_V2, OK

# states
IDENTIFY, TLS, COMPRESSION, AUTH, SUB, READY = "identify", "tls", "compression", "auth", "sub", "ready"

_INT_FEATURES = ("max_rdy_count", "msg_timeout", "max_msg_timeout", "max_deflate_level",
                 "deflate_level", "sample_rate", "output_buffer_size", "output_buffer_timeout")
_BOOL_FEATURES = ("tls_v1", "snappy", "deflate", "auth_required")


class Upgrade:
    """An action for the caller: switch the stream to ``kind`` ("tls", "snappy", "deflate").
    (Plain classes here, not dataclasses: `nsqcli pub` start-up time counts every millisecond.)"""

    __slots__ = ("kind", "level")

    def __init__(self, kind: str, level: int = 6):
        self.kind = kind
        self.level = level

    def __eq__(self, other) -> bool:
        return isinstance(other, Upgrade) and (self.kind, self.level) == (other.kind, other.level)

    def __hash__(self) -> int:
        return hash((self.kind, self.level))

    def __repr__(self) -> str:
        return f"Upgrade({self.kind!r}, {self.level})"


class Negotiated:
    """The features nsqd agreed to (defaults when it answered a plain OK)."""

    __slots__ = ("max_rdy_count", "msg_timeout", "max_msg_timeout", "tls", "compression",
                 "deflate_level", "auth_required", "version", "features")

    def __init__(self, max_rdy_count: int = DEFAULT_MAX_RDY_COUNT, msg_timeout: float = 60.0,
                 max_msg_timeout: float | None = None, tls: bool = False, compression: str | None = None,
                 deflate_level: int = 6, auth_required: bool = False, version: str = "",
                 features: dict | None = None):
        self.max_rdy_count = max_rdy_count
        self.msg_timeout = msg_timeout              # seconds
        self.max_msg_timeout = max_msg_timeout      # seconds
        self.tls = tls
        self.compression = compression              # "snappy" | "deflate"
        self.deflate_level = deflate_level
        self.auth_required = auth_required
        self.version = version
        self.features = features if features is not None else {}


def parse_identify_reply(reply: bytes, requested: dict) -> Negotiated:
    """Check nsqd's IDENTIFY reply against what was asked (``requested`` is the IDENTIFY body).

    Raises RemoteProtocolError for a reply that is not a JSON object, a feature of the wrong
    type, or an upgrade the client did not ask for."""
    if reply == OK:
        return Negotiated()
    f = _json_object(reply, "IDENTIFY")
    for key in _INT_FEATURES:
        v = f.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise RemoteProtocolError(f"IDENTIFY reply has an invalid {key}: {v!r}")
    for key in _BOOL_FEATURES:
        v = f.get(key)
        if v is not None and not isinstance(v, bool):
            raise RemoteProtocolError(f"IDENTIFY reply has an invalid {key}: {v!r}")
    if not isinstance(f.get("version", ""), str):
        raise RemoteProtocolError(f"IDENTIFY reply has an invalid version: {f['version']!r}")
    for key in ("tls_v1", "snappy", "deflate"):
        if f.get(key) and not requested.get(key):
            raise RemoteProtocolError(f"nsqd turned on {key} although the client did not ask for it")
    if f.get("snappy") and f.get("deflate"):
        raise RemoteProtocolError("nsqd turned on both snappy and deflate")
    max_rdy = f.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)
    if max_rdy < 1:
        raise RemoteProtocolError(f"IDENTIFY reply has an invalid max_rdy_count: {max_rdy!r}")
    max_msg = f.get("max_msg_timeout")
    return Negotiated(
        max_rdy_count=max_rdy,
        msg_timeout=f.get("msg_timeout", 60000) / 1000.0,
        max_msg_timeout=max_msg / 1000.0 if max_msg else None,
        tls=bool(f.get("tls_v1")),
        compression="snappy" if f.get("snappy") else "deflate" if f.get("deflate") else None,
        deflate_level=f.get("deflate_level", requested.get("deflate_level", 6)) or 6,
        auth_required=bool(f.get("auth_required")),
        version=f.get("version", ""),
        features=f,
    )


#: nsqd's words (client_v2.go, v1.0-1.3) when it refuses one IDENTIFY value -> the field
_REFUSED_FIELDS = (("output buffer timeout", "output_buffer_timeout"), ("output buffer size", "output_buffer_size"),
                   ("heartbeat interval", "heartbeat_interval"), ("sample rate", "sample_rate"),
                   ("msg timeout", "msg_timeout"))


def refused_identify_field(error) -> str | None:
    """The IDENTIFY field an nsqd error refuses (``E_BAD_BODY IDENTIFY output buffer timeout
    (50) is invalid`` -> ``"output_buffer_timeout"``), or None for any other error. nsqd
    closes the connection after it; the same IDENTIFY without that field (0 = nsqd's own
    default) is accepted. ``error``: a ServerError or its text."""
    text = str(getattr(error, "detail", error))
    if "E_BAD_BODY" not in text or "IDENTIFY" not in text or "invalid" not in text:
        return None
    for words, name in _REFUSED_FIELDS:
        if words in text:
            return name
    return None


def parse_auth_reply(reply: bytes) -> dict:
    return _json_object(reply, "AUTH")


def _json_object(reply: bytes, what: str) -> dict:
    try:
        value = json.loads(reply)
    except ValueError:
        raise RemoteProtocolError(f"{what} reply is not JSON: {reply[:60]!r}") from None
    if not isinstance(value, dict):
        raise RemoteProtocolError(f"{what} reply is not a JSON object: {reply[:60]!r}")
    return value


def check_ok(reply: bytes, what: str) -> None:
    """A response that must be OK (PUB/MPUB/DPUB, SUB, upgrades)."""
    if reply != OK:
        if reply == CLOSE_WAIT:
            raise RemoteProtocolError(f"nsqd is closing the connection (CLOSE_WAIT) instead of answering {what}")
        raise RemoteProtocolError(f"expected OK after {what}, got {reply[:60]!r}")


class Handshake:
    """The client side of the handshake. Pure: frames in, actions out."""

    def __init__(self, identify: dict, auth_secret: str | bytes | None = None,
                 subscribe: tuple[str, str] | None = None, address: str | None = None):
        self.address = address
        self.identify = identify
        self.auth_secret = auth_secret
        self.subscribe = subscribe
        self.state = IDENTIFY
        self.negotiated = Negotiated()
        self.auth_info: dict | None = None
        self._sub = encode_sub(*subscribe) if subscribe else None  # validates names up front

    @property
    def done(self) -> bool:
        return self.state == READY

    @property
    def waiting_for(self) -> str:
        return {IDENTIFY: "IDENTIFY", TLS: "TLS upgrade", COMPRESSION: "compression upgrade",
                AUTH: "AUTH", SUB: "SUB", READY: "nothing"}[self.state]

    def start(self) -> bytes:
        """The first bytes to send: magic and IDENTIFY."""
        return MAGIC_V2 + encode_identify(self.identify)

    def receive_frame(self, ftype: int, data: bytes) -> list:
        """Advance on one frame; returns actions: ``bytes`` to send, ``Upgrade`` to perform."""
        try:
            return self._receive(ftype, data)
        except RemoteProtocolError as e:
            if self.address:
                raise RemoteProtocolError(f"{self.address}: {e}") from None
            raise

    def _receive(self, ftype: int, data: bytes) -> list:
        what = self.waiting_for
        if self.state == READY:
            raise RemoteProtocolError(f"unexpected frame after the handshake: {data[:60]!r}")
        if ftype == FRAME_ERROR:
            raise server_error(data, self.address)
        if ftype == FRAME_MESSAGE:
            raise RemoteProtocolError(f"message frame during {what}")
        if data == HEARTBEAT:
            return [NOP]
        if self.state == IDENTIFY:
            self.negotiated = parse_identify_reply(data, self.identify)
            if self.identify.get("tls_v1") and not self.negotiated.tls:
                raise ConnectError("TLS was asked for but nsqd does not offer it (start nsqd with "
                                   "--tls-cert/--tls-key)", self.address)
            if self.negotiated.tls:
                self.state = TLS
                return [Upgrade("tls")]
            return self._after_tls()
        if self.state == TLS:
            check_ok(data, what)
            return self._after_tls()
        if self.state == COMPRESSION:
            check_ok(data, what)
            return self._after_compression()
        if self.state == AUTH:
            self.auth_info = parse_auth_reply(data)
            return self._after_auth()
        check_ok(data, what)  # SUB
        self.state = READY
        return []

    def _after_tls(self) -> list:
        n = self.negotiated
        if n.compression:
            self.state = COMPRESSION
            return [Upgrade(n.compression, n.deflate_level)]
        return self._after_compression()

    def _after_compression(self) -> list:
        if self.negotiated.auth_required:
            if not self.auth_secret:
                raise AuthError("nsqd requires authentication: give --auth-secret "
                                "(or NSQCLI_AUTH_SECRET)", self.address, code="E_AUTH_REQUIRED")
            self.state = AUTH
            return [encode_auth(self.auth_secret)]
        return self._after_auth()

    def _after_auth(self) -> list:
        if self._sub is not None:
            self.state = SUB
            return [self._sub]
        self.state = READY
        return []


# -- after the handshake --------------------------------------------------------------------

#: why a publish got no answer (Unanswered.reason)
NOT_PROCESSED = "not processed"   # nsqd closed after an earlier error: certainly not published
UNKNOWN = "unknown"               # the connection was lost: nsqd may have published it

#: commands whose answer is OK or E_* (everything else gets no answer, or CLOSE_WAIT for CLS)
_ANSWERED = (b"PUB ", b"MPUB", b"DPUB")

# session states
OPEN, CLOSING, MUST_CLOSE, CLOSED = "open", "closing", "must-close", "closed"


class Answered:
    """nsqd answered the publish ``token``: ``error`` is None for OK, else the ServerError
    (or RemoteProtocolError for an answer that is neither)."""

    __slots__ = ("token", "error")

    def __init__(self, token, error=None):
        self.token = token
        self.error = error

    def __repr__(self) -> str:
        return f"Answered({self.token!r}, {self.error!r})"


class Unanswered:
    """The publish ``token`` will never be answered; ``reason`` is NOT_PROCESSED or UNKNOWN."""

    __slots__ = ("token", "reason")

    def __init__(self, token, reason: str):
        self.token = token
        self.reason = reason

    def __repr__(self) -> str:
        return f"Unanswered({self.token!r}, {self.reason!r})"


class ServerErrorEvent:
    """An error frame that answers no publish (E_FIN_FAILED..., or a fatal one on a consumer)."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error

    @property
    def fatal(self) -> bool:
        return self.error.fatal

    def __repr__(self) -> str:
        return f"ServerErrorEvent({self.error!r})"


class CloseWaitEvent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "CloseWait"


CLOSE_WAIT_EVENT = CloseWaitEvent()


class Session:
    """The state of one connection after its handshake. Pure; the caller serialises calls
    (one lock around :meth:`send` + writing its bytes, and around :meth:`receive`), so the
    order of tokens is the order of bytes on the wire.

    Messages pass through :meth:`receive` untouched (the hot path: a list in, the same
    objects out); everything else becomes an event."""

    def __init__(self, address: str | None = None, subscribed: bool = False):
        self.address = address
        self.subscribed = subscribed  # only a subscribed connection may receive messages
        self.state = OPEN
        self.queued: collections.deque = collections.deque()   # publishes not written yet
        self.pending: collections.deque = collections.deque()  # written, waiting for the answer
        self.heartbeats = 0
        self._out: list[bytes] = []

    @property
    def waiting(self) -> int:
        """Publishes sent (queued or written) and not answered yet."""
        return len(self.pending) + len(self.queued)

    def tokens(self) -> list:
        """Every unanswered publish's token, oldest first."""
        return list(self.pending) + list(self.queued)

    def flushed(self) -> None:
        """Everything queued so far is being written now: from here on an answer can be theirs
        (an answer that arrived before its command was written is not)."""
        if self.queued:
            self.pending += self.queued
            self.queued.clear()

    def send(self, command: bytes, token=None) -> bytes:
        """The bytes to write for ``command``. A publish needs a ``token`` (any object, e.g. a
        future): it comes back in the Answered/Unanswered event for this command. Raises
        LocalProtocolError after a fatal error or once the connection is lost (nothing is
        queued then)."""
        if self.state in (MUST_CLOSE, CLOSED):  # after CLS, FIN/REQ/RDY still go out
            raise LocalProtocolError(f"connection is {self.state}: {command[:12]!r} not sent")
        if command[:4] in _ANSWERED:
            if token is None:
                raise LocalProtocolError("a publish needs a token for its answer")
            self.queued.append(token)
        elif command == CLS:
            self.state = CLOSING
        return command

    def data_to_send(self) -> list[bytes]:
        """Bytes the session itself wants sent (NOP for heartbeats), oldest first."""
        out, self._out = self._out, []
        return out

    def receive(self, items: list) -> tuple[list, list]:
        """Decoded frames in (``FrameDecoder.decode_all``), ``(messages, events)`` out, in
        order within each list. Raises RemoteProtocolError for an answer nobody asked for."""
        msgs = [item for item in items if type(item) is not Frame]
        return msgs, self.receive_frames([item for item in items if type(item) is Frame], bool(msgs))

    def receive_frames(self, frames: list, messages: bool = False) -> list:
        """The hot path (``FrameDecoder.decode`` keeps messages apart): responses and errors
        in, events out, in order; ``messages``: messages came too (on a connection that did not
        subscribe that is a protocol error, raised before any answer is taken)."""
        if messages and not self.subscribed:
            where = f"{self.address}: " if self.address else ""
            raise RemoteProtocolError(f"{where}a message on a connection that did not subscribe")
        events: list = []
        for frame in frames:
            if frame.type == FRAME_ERROR:
                self._error(server_error(frame.data, self.address), events)
            else:
                self._response(frame.data, events)
        return events

    def _response(self, data: bytes, events: list) -> None:
        if data == HEARTBEAT:
            self.heartbeats += 1
            self._out.append(NOP)
        elif data == CLOSE_WAIT and self.state == OPEN and self.pending:
            # nsqd closes instead of answering (we sent no CLS): the publish failed
            events.append(Answered(self.pending.popleft(), RemoteProtocolError(
                f"{self.address}: nsqd is closing the connection (CLOSE_WAIT) instead of answering a publish")))
            self.state = MUST_CLOSE
            self._not_processed(events)
        elif data == CLOSE_WAIT:
            self.state = CLOSING if self.state == OPEN else self.state
            events.append(CLOSE_WAIT_EVENT)
        elif self.pending:
            token = self.pending.popleft()
            error = None if data == OK else RemoteProtocolError(
                f"{self.address}: expected OK to a publish, got {data[:60]!r}")
            events.append(Answered(token, error))
        else:
            where = f"{self.address}: " if self.address else ""
            raise RemoteProtocolError(f"{where}unexpected response {data[:60]!r} (nothing was asked)")

    def _error(self, err, events: list) -> None:
        if not err.fatal:
            events.append(ServerErrorEvent(err))
            return
        self.state = MUST_CLOSE  # nsqd closes the connection after a fatal error
        if self.pending:
            events.append(Answered(self.pending.popleft(), err))
        else:
            events.append(ServerErrorEvent(err))
        self._not_processed(events)

    def _not_processed(self, events: list) -> None:
        """After a fatal error nsqd reads nothing more: later publishes were not published."""
        events.extend(Unanswered(t, NOT_PROCESSED) for t in self.pending)
        events.extend(Unanswered(t, NOT_PROCESSED) for t in self.queued)
        self.pending.clear()
        self.queued.clear()

    def connection_lost(self) -> list:
        """The connection is gone: a publish written and not answered gets Unanswered(UNKNOWN)
        (nsqd may have published it), one never written Unanswered(NOT_PROCESSED)."""
        self.state = CLOSED
        events = [Unanswered(t, UNKNOWN) for t in self.pending]
        events += [Unanswered(t, NOT_PROCESSED) for t in self.queued]
        self.pending.clear()
        self.queued.clear()
        return events
