"""The connection handshake as a pure state machine (h11's Connection is the model).

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
"""

from __future__ import annotations

import json
from ..errors import AuthError, ConnectError, RemoteProtocolError, server_error
from .commands import NOP, encode_auth, encode_identify, encode_sub
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
