"""The whole nsqcli exception tree, in one place.

    NSQError
    ├── LocalProtocolError      we were asked to build something illegal (bad name, RDY < 0, empty MPUB)
    ├── RemoteProtocolError     the peer sent bytes that are not NSQ (garbage, oversize frame)
    ├── TransportError          socket-level trouble; carries ``address``
    │   ├── ConnectError
    │   ├── ReadError
    │   ├── WriteError
    │   └── Timeout             (also a builtin TimeoutError)
    ├── ServerError             an ``E_*`` error frame from nsqd; carries ``code``, ``fatal``
    │   ├── one class per E_* code (E_BAD_TOPIC -> BadTopicError, ...)
    │   └── AuthError           E_AUTH_FAILED, E_UNAUTHORIZED, auth required but no secret
    ├── LookupdError            an nsqlookupd / nsqd HTTP endpoint failed; carries ``endpoint``, ``status``
    ├── PublishError            a publish did not fully succeed; says what was and was not published
    └── SandboxError            the local NSQ sandbox could not start
"""

from __future__ import annotations


class NSQError(Exception):
    """Root of every error nsqcli raises on purpose."""


class LocalProtocolError(NSQError, ValueError):
    """We were asked to encode something nsqd would reject (caught before it hits the wire)."""


class RemoteProtocolError(NSQError):
    """The peer sent bytes that do not follow the NSQ protocol."""


class TransportError(NSQError):
    """A socket-level failure talking to ``address``: ``reason`` says what, ``fix`` (may be
    "") what to do about it; the message is "address: reason: fix"."""

    def __init__(self, message: str, address: str | None = None, fix: str = ""):
        text = f"{message}: {fix}" if fix else message
        super().__init__(f"{address}: {text}" if address else text)
        self.address = address
        self.reason = message
        self.fix = fix


class ConnectError(TransportError):
    """Could not establish (or upgrade) the connection."""


class ReadError(TransportError):
    """The connection failed or closed while reading."""


class WriteError(TransportError):
    """The connection failed while writing."""


class Timeout(TransportError, TimeoutError):
    """An operation did not finish in time."""


class ServerError(NSQError):
    """An error frame (``E_*``) sent by nsqd.

    ``fatal`` is False only for E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED: after those
    nsqd keeps the connection open; after any other error it closes it.
    """

    code = "E_UNKNOWN"
    fatal = True

    def __init__(self, message: str, address: str | None = None, code: str | None = None):
        if code is not None:
            self.code = code
        self.detail = message
        self.address = address
        where = f"{address}: " if address else ""
        super().__init__(f"{where}{message}")


class AuthError(ServerError):
    """Authentication failed or is required (E_AUTH_FAILED, E_UNAUTHORIZED, missing secret)."""

    code = "E_AUTH_FAILED"


def _server_error(name: str, code: str, base: type = ServerError, fatal: bool = True) -> type:
    cls = type(name, (base,), {"code": code, "fatal": fatal, "__doc__": f"nsqd answered {code}."})
    cls.__module__ = __name__
    return cls


InvalidError = _server_error("InvalidError", "E_INVALID")
BadBodyError = _server_error("BadBodyError", "E_BAD_BODY")
BadTopicError = _server_error("BadTopicError", "E_BAD_TOPIC")
BadChannelError = _server_error("BadChannelError", "E_BAD_CHANNEL")
BadMessageError = _server_error("BadMessageError", "E_BAD_MESSAGE")
PubFailedError = _server_error("PubFailedError", "E_PUB_FAILED")
MPubFailedError = _server_error("MPubFailedError", "E_MPUB_FAILED")
DPubFailedError = _server_error("DPubFailedError", "E_DPUB_FAILED")
FinFailedError = _server_error("FinFailedError", "E_FIN_FAILED", fatal=False)
ReqFailedError = _server_error("ReqFailedError", "E_REQ_FAILED", fatal=False)
TouchFailedError = _server_error("TouchFailedError", "E_TOUCH_FAILED", fatal=False)
AuthFailedError = _server_error("AuthFailedError", "E_AUTH_FAILED", base=AuthError)
UnauthorizedError = _server_error("UnauthorizedError", "E_UNAUTHORIZED", base=AuthError)
AuthDisabledError = _server_error("AuthDisabledError", "E_AUTH_DISABLED", base=AuthError)

SERVER_ERRORS: dict[str, type[ServerError]] = {
    cls.code: cls
    for cls in (
        InvalidError, BadBodyError, BadTopicError, BadChannelError, BadMessageError,
        PubFailedError, MPubFailedError, DPubFailedError, FinFailedError, ReqFailedError,
        TouchFailedError, AuthFailedError, UnauthorizedError, AuthDisabledError,
    )
}


def server_error(data: bytes, address: str | None = None) -> ServerError:
    """Build the typed error for an error frame's payload, e.g. ``b"E_BAD_TOPIC PUB topic name ..."``."""
    text = data.decode("utf-8", "replace").strip()
    code = text.split(" ", 1)[0]
    cls = SERVER_ERRORS.get(code)
    if cls is None:
        return ServerError(text, address, code=code or "E_UNKNOWN")
    return cls(text, address)


class LookupdError(NSQError):
    """An HTTP endpoint (nsqlookupd or nsqd) failed; ``status`` is the HTTP status or None."""

    def __init__(self, message: str, endpoint: str, status: int | None = None):
        super().__init__(f"{endpoint}: {message}")
        self.endpoint = endpoint
        self.status = status


class PublishError(NSQError):
    """A publish did not complete. ``published`` counts the messages nsqd acknowledged
    before the failure; ``cause`` is the underlying error."""

    def __init__(self, message: str, published: int = 0, failed: int = 0,
                 cause: BaseException | None = None):
        super().__init__(message)
        self.published = published
        self.failed = failed
        self.cause = cause


class SandboxError(NSQError):
    """The local NSQ sandbox (real nsqd / nsqlookupd processes) could not be started."""
