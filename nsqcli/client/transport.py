"""The byte stream under a Connection: a TCP socket and its upgrades (TLS, snappy framing,
raw deflate). The only module that catches OSError and maps it to TransportError.

The stream interface a Connection needs (``Stream`` here; tests feed a memory stream). It is
driven by an I/O loop (nsqcli.client.loop) and never blocks: ``dial(address, timeout)`` starts
a non-blocking connect (``connecting`` true until ``finish_connect()``), ``fileno()``
(readable when data may be there), ``recv() -> bytes | None`` (b"" for nothing yet),
``pending()`` (data buffered where select() cannot see it), ``encode(bytes)`` (commands as
they go on the wire), ``send_nowait(wire) -> int``, ``start_tls(cfg)`` + ``tls_step()``,
``upgrade_compression(kind, level)``, ``decompress(leftover)``,
``shutdown_write()``, ``close()``, ``plain``, ``tls_version``, ``compression``.

Decompression is bounded: one ``recv`` returns at most ``MAX_DECOMPRESSED`` bytes and keeps the
rest of the compressed input for the next call (``pending()`` is then true), so a stream that
expands 1000x cannot make the client buffer more than the frame decoder allows."""

from __future__ import annotations

import errno
import os
import socket
import zlib

from .config import TLSConfig
from ..errors import ConnectError, ReadError, WriteError

RECV_SIZE = 256 * 1024
#: most decompressed bytes one recv() returns; the rest waits in the decompressor's input
MAX_DECOMPRESSED = 1024 * 1024
#: snappy input is fed in slices this big (a snappy chunk expands to at most 64 KiB)
SNAPPY_SLICE = 16 * 1024
#: most bytes one TLS write takes (a failed write is retried with exactly these bytes)
TLS_CHUNK = 256 * 1024

TLS_VERSIONS = ("1.0", "1.1", "1.2", "1.3")


def split_address(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port). Raises ValueError naming the problem."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


#: (what the file must hold, the line that starts it) per TLS file
_PEM = {"ca": ("the PEM certificate(s) of the CA that signed the server's certificate", b"-----BEGIN CERTIFICATE-----"),
        "cert": ("a PEM certificate", b"-----BEGIN CERTIFICATE-----"),
        "key": ("a PEM private key", b"-----BEGIN ")}


def pem_problem(path: str, kind: str = "ca") -> str | None:
    """Why the TLS file ``path`` cannot be what it is given as (``kind``: "ca", "cert" or
    "key"): "is empty: ...", "is not PEM: ..." or "cannot be read: ..."; None when it looks
    right. Cheap (the first MiB is read), so it runs when the options are checked, before any
    connection."""
    what, marker = _PEM[kind]
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not head.strip():
        return f"is empty: it must hold {what}"
    if marker not in head:
        return f"is not PEM (no '{marker.decode().strip()}' line): it must hold {what}"
    return None


#: TLSConfig -> its SSLContext: built once per run (reading the CA bundle per connection costs
#: ~1 ms each), shared by every connection (an SSLContext may wrap sockets in many threads)
_contexts: dict = {}


def ssl_context(cfg: TLSConfig):
    """A client context that verifies the certificate and hostname unless told otherwise.
    Raises ConnectError naming a CA, certificate or key file that is empty, not PEM or does
    not load."""
    ctx = _contexts.get(cfg)
    if ctx is None:
        ctx = _contexts[cfg] = _new_context(cfg)
    return ctx


def _new_context(cfg: TLSConfig):
    import ssl  # lazy: most runs never use TLS, and `nsqcli pub` start-up time matters

    for kind, path in (("ca", cfg.ca_file), ("cert", cfg.cert_file), ("key", cfg.key_file)):
        why = path and pem_problem(path, kind)
        if why:
            raise ConnectError(f"TLS {'CA' if kind == 'ca' else kind} file {path} {why}")
    try:
        ctx = ssl.create_default_context(cafile=cfg.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConnectError(f"cannot load the TLS CA file {cfg.ca_file}: {_ssl_text(e)}") from e
    if cfg.cert_file:
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        except (OSError, ssl.SSLError) as e:
            raise ConnectError(f"cannot load the TLS client certificate {cfg.cert_file} with key "
                               f"{cfg.key_file}: {_ssl_text(e)} (do they belong together?)") from e
    if cfg.min_version:
        if cfg.min_version not in TLS_VERSIONS:
            raise ValueError(f"invalid TLS minimum version {cfg.min_version!r}: use 1.0, 1.1, 1.2 or 1.3")
        ctx.minimum_version = getattr(ssl.TLSVersion, "TLSv" + cfg.min_version.replace(".", "_")
                                      if cfg.min_version != "1.0" else "TLSv1")
    if cfg.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _ssl_text(e: BaseException) -> str:
    """An SSLError's reason without OpenSSL's source location: "NO_CERTIFICATE_OR_CRL_FOUND"."""
    reason = getattr(e, "reason", None)
    if reason:
        return str(reason)
    return getattr(e, "strerror", None) or str(e)


#: alerts meaning the server and the client have no TLS version in common
_VERSION_REASONS = ("TLSV1_ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE",
                    "WRONG_SSL_VERSION", "TLSV1_ALERT_INAPPROPRIATE_FALLBACK")
#: alerts a server sends when it wants a client certificate it did not get (or did not accept)
_CLIENT_CERT_REASONS = ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE",
                        "SSLV3_ALERT_BAD_CERTIFICATE", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
                        "TLSV1_ALERT_DECRYPT_ERROR", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
                        "TLSV1_ALERT_ACCESS_DENIED")


def _version_tuple(version: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in version.lstrip("v").split("-")[0].split(".")[:3])
    except ValueError:
        return None


def tls_failure(e: BaseException, cfg: TLSConfig, server: str = "nsqd", version: str | None = None) -> tuple[str, str]:
    """(cause, fix) for a failed TLS handshake with ``server`` (its ``version`` when the
    IDENTIFY answer named it): a TLS version mismatch, a client certificate required or refused,
    a certificate that does not verify; else the OpenSSL reason. ``fix`` may be ""."""
    import ssl

    if isinstance(e, ssl.SSLCertVerificationError):
        return (f"TLS certificate verification failed: {e.verify_message}",
                f"give --tls-ca-file with the CA that signed {server}'s certificate, or "
                "--tls-insecure-skip-verify to skip the check")
    reason = _ssl_text(e)
    named = f"{server} v{version.lstrip('v')}" if version else server
    if reason in _VERSION_REASONS:
        v = _version_tuple(version) if version else None
        ceiling = "" if v is not None and v > (1, 2, 1) else "; nsqd 1.2.1 and older support TLS up to 1.2"
        asked = f"--tls-min-version {cfg.min_version}" if cfg.min_version else "this client's TLS versions"
        fix = ("lower --tls-min-version (1.2 or leave it out)" if cfg.min_version in ("1.3",)
               else "check the server's --tls-min-version")
        return f"TLS handshake failed: {named} accepts none of {asked} ({reason}{ceiling})", fix
    if reason in _CLIENT_CERT_REASONS:
        if not cfg.cert_file:
            return (f"TLS handshake failed: {named} requires a client certificate ({reason})",
                    "give --tls-cert FILE and --tls-key FILE, signed by a CA in its --tls-root-ca-file")
        return (f"TLS handshake failed: {named} refused the client certificate {cfg.cert_file} ({reason})",
                "it must be signed by a CA in the server's --tls-root-ca-file")
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"):
        return f"TLS handshake failed: {named} did not answer in TLS ({reason})", ""
    return f"TLS handshake failed: {reason}", ""


class _Snappy:
    def __init__(self):
        import snappy  # python-snappy (framing format, via cramjam)

        self._c = snappy.StreamCompressor()
        self._d = snappy.StreamDecompressor()
        self._in = bytearray()

    def compress(self, data: bytes) -> bytes:
        return self._c.add_chunk(data)

    def decompress(self, data: bytes) -> bytes:
        """Up to about MAX_DECOMPRESSED bytes; the unused input stays for the next call."""
        self._in += data
        out, size = [], 0
        while self._in and size < MAX_DECOMPRESSED:
            piece = bytes(self._in[:SNAPPY_SLICE])
            del self._in[:SNAPPY_SLICE]
            chunk = self._d.decompress(piece)
            out.append(chunk)
            size += len(chunk)
        return b"".join(out)

    def has_more(self) -> bool:
        return bool(self._in)


class _Deflate:
    def __init__(self, level: int):
        self._c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        self._full = False

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        """At most MAX_DECOMPRESSED bytes; the unused input stays for the next call."""
        tail = self._d.unconsumed_tail
        out = self._d.decompress(tail + data if tail else data, MAX_DECOMPRESSED)
        # output cut at the limit: zlib may hold more (the rest of a long match) even with no
        # input left over, so the caller must ask again before waiting for the socket
        self._full = len(out) >= MAX_DECOMPRESSED
        return out

    def has_more(self) -> bool:
        return self._full or bool(self._d.unconsumed_tail)


class Stream:
    """A connected socket with optional TLS and compression. Not thread-safe: one owner."""

    def __init__(self, sock: socket.socket, address: str):
        self.sock = sock
        self.address = address
        self._codec: _Snappy | _Deflate | None = None
        self.tls_version: str | None = None
        self.compression: str | None = None
        self.connecting = False
        self._retry: bytes | None = None  # a TLS write to retry with the same bytes
        #: nsqd's version from its IDENTIFY answer (set by the Connection before start_tls), named
        #: in a TLS failure: nsqd 1.2.1 and older support TLS up to 1.2
        self.peer_version: str | None = None
        self._tls_cfg: TLSConfig | None = None

    @classmethod
    def dial(cls, address: str, timeout: float) -> "Stream":
        """Start connecting without waiting (the I/O loop waits: writable, then
        :meth:`finish_connect`); ``timeout`` is the loop's to enforce. Only the name lookup
        blocks (an IP address or ``localhost`` does not)."""
        host, port = split_address(address)
        try:  # an ASCII host as bytes: a str goes through the idna codec (~1.5 ms of imports)
            infos = socket.getaddrinfo(host.encode() if host.isascii() else host, port,
                                       type=socket.SOCK_STREAM)
        except OSError as e:
            raise ConnectError(f"cannot connect: {e.strerror or e}", address) from e
        family, type_, proto, _, sockaddr = infos[0]
        try:
            sock = socket.socket(family, type_, proto)
        except OSError as e:  # EMFILE: the process is out of file descriptors
            err = ConnectError(f"cannot connect: {e.strerror or e}", address)
            err.errno = e.errno
            raise err from e
        sock.setblocking(False)
        err = sock.connect_ex(sockaddr)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            raise ConnectError(f"cannot connect: {os.strerror(err)}", address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = cls(sock, address)
        stream.connecting = err != 0
        return stream

    def finish_connect(self) -> None:
        """After the socket became writable: did the connect succeed?"""
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise ConnectError(f"cannot connect: {os.strerror(err)}", self.address)
        self.connecting = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def pending(self) -> bool:
        """True when TLS has decrypted bytes, or the decompressor unused input, buffered where
        select() cannot see them."""
        if self._codec is not None and self._codec.has_more():
            return True
        return self.tls_version is not None and self.sock.pending() > 0

    def recv(self) -> bytes | None:
        """Bytes from the peer (decompressed; b"" when nothing is there yet, or while a
        compressed chunk or TLS record is partial); None when the peer closed the connection."""
        codec = self._codec
        if codec is not None and codec.has_more():
            return self._decompress(b"")
        try:
            data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as e:
            if self.tls_version is not None and _ssl_wants(e):
                return b""
            raise self._failure(ReadError, "read failed", e) from e
        if not data:
            return None
        return data if codec is None else self._decompress(data)

    def _decompress(self, data: bytes) -> bytes:
        try:
            return self._codec.decompress(data)
        except Exception as e:  # zlib.error, cramjam's errors, ValueError ...
            raise ReadError(f"{self.compression} stream corrupt: {e}", self.address) from e

    def encode(self, data: bytes) -> bytes:
        """Commands as they go on the wire (compressed on a compressed stream). One caller at
        a time, in send order."""
        return data if self._codec is None else self._codec.compress(data)

    @property
    def plain(self) -> bool:
        """No TLS, no compression: bytes go to the socket as they are (send_nowait from any
        thread is safe)."""
        return self.tls_version is None and self._codec is None

    def send_nowait(self, data: bytes) -> int:
        """Send what the socket takes now, without waiting; returns the bytes of ``data`` sent
        (0 when its buffer is full). ``data`` is wire bytes (see :meth:`encode`).

        On TLS a write that could not finish must be retried with the same bytes: the caller
        passes the front of what it has to send, which starts with the retried bytes."""
        if self.tls_version is not None:
            return self._send_tls(data)
        try:
            return self.sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            raise WriteError(f"write failed: {e.strerror or e}", self.address) from e

    def _send_tls(self, data: bytes) -> int:
        chunk = self._retry if self._retry is not None else data[:TLS_CHUNK]
        try:
            n = self.sock.send(chunk)
        except (BlockingIOError, InterruptedError):
            self._retry = chunk
            return 0
        except OSError as e:
            if _ssl_wants(e):
                self._retry = chunk
                return 0
            raise self._failure(WriteError, "write failed", e) from e
        self._retry = None
        return n

    # -- TLS, without blocking -------------------------------------------------------------------
    def start_tls(self, cfg: TLSConfig) -> None:
        """Wrap the socket; :meth:`tls_step` drives the handshake."""
        import ssl

        ctx = ssl_context(cfg)
        self._tls_cfg = cfg
        hostname = cfg.server_hostname or split_address(self.address)[0]
        try:
            self.sock = ctx.wrap_socket(self.sock, server_hostname=hostname, do_handshake_on_connect=False)
        except (ssl.SSLError, OSError) as e:
            raise self._failure(ConnectError, "TLS handshake failed", e) from e

    def tls_step(self) -> str | None:
        """One step of the TLS handshake: None when done, else "read" or "write" (what the
        socket must become before the next step)."""
        import ssl

        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            return "read"
        except ssl.SSLWantWriteError:
            return "write"
        except (ssl.SSLError, OSError) as e:
            raise self._failure(ConnectError, "TLS handshake failed", e) from e
        self.tls_version = self.sock.version()
        return None

    def _failure(self, cls, what: str, e: OSError):
        """The error to raise for ``e``: a TLS failure named by its cause, with the fix (see
        tls_failure: TLS 1.3 says "client certificate required" at the first read, not in the
        handshake), else ``what: strerror``."""
        import ssl

        if self._tls_cfg is not None and isinstance(e, ssl.SSLError) and not isinstance(e, ssl.SSLEOFError):
            cause, fix = tls_failure(e, self._tls_cfg, "nsqd", self.peer_version)
            return cls(cause, self.address, fix=fix)
        return cls(f"{what}: {e.strerror or e}", self.address)

    def upgrade_compression(self, kind: str, level: int = 6) -> None:
        self._codec = _Snappy() if kind == "snappy" else _Deflate(level)
        self.compression = kind

    def decompress(self, data: bytes) -> bytes:
        """Feed bytes that were read before the upgrade took effect."""
        return self._decompress(data) if (self._codec and data) else data

    def shutdown_write(self) -> None:
        """Half-close: the peer reads everything sent so far, then EOF."""
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _ssl_wants(e: OSError) -> bool:
    """An SSLWantRead/WriteError: the TLS layer needs the socket ready first, not a failure."""
    import ssl

    return isinstance(e, (ssl.SSLWantReadError, ssl.SSLWantWriteError))
