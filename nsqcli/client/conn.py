"""Connection: one link to one nsqd.

Lifecycle: dial -> magic "  V2" -> IDENTIFY (feature negotiation) -> TLS -> snappy|deflate ->
AUTH -> (SUB/PUB...) -> CLS -> CLOSE_WAIT -> close.

Threading: after the handshake ONE I/O thread owns the socket. It reads, decodes frames,
answers heartbeats with NOP at once, hands messages/responses to the delegate, and writes.
Other threads never touch the socket: ``write()`` appends to a buffer and wakes the I/O thread
through a pipe, so every command written between two wake-ups goes out in one ``send`` (many
FIN/RDY coalesced, compressed once) and TLS is never read and written concurrently.

The delegate (Producer or Consumer) receives, on the I/O thread:
``on_messages(conn, [Message])``, ``on_response(conn, bytes)``, ``on_error(conn, ServerError)``,
``on_close(conn, error_or_None)``. It must not block.
"""

from __future__ import annotations

import json
import os
import selectors
import threading
import time
from dataclasses import dataclass, field

from .config import Config
from ..errors import (AuthError, LocalProtocolError, NSQError, ReadError, RemoteProtocolError,
                     Timeout, TransportError, server_error)
from ..protocol import (FRAME_ERROR, FRAME_MESSAGE, MAGIC_V2, NEED_DATA, FrameDecoder, Message,
                       encode_auth, encode_identify, encode_sub)
from ..protocol.commands import CLS, NOP
from ..protocol.constants import CLOSE_WAIT, HEARTBEAT, OK
from .transport import Stream


# states
INIT, CONNECTED, CLOSING, CLOSED = "init", "connected", "closing", "closed"


@dataclass
class ConnStats:
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


class Connection:
    """One nsqd link. ``connect()`` does the handshake synchronously, then starts the I/O thread."""

    def __init__(self, address: str, config: Config, delegate, name: str = "nsqcli"):
        self.address = address
        self.config = config
        self.delegate = delegate
        self.name = name
        self.state = INIT
        self.features: dict = {}
        self.auth_info: dict | None = None
        self.max_rdy_count = 2500
        self.msg_timeout = 60.0
        self.close_error: BaseException | None = None
        self.closed_event = threading.Event()
        self.close_wait_event = threading.Event()
        self.responder = None  # attached to every message at decode (the consumer's handle)
        # counters (written by the I/O thread, or under the consumer's lock)
        self.rdy = 0
        self.rdy_sent = 0
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.timed_out = 0
        self.heartbeats = 0
        self.late_messages = 0
        self.last_message: float | None = None
        self.connected_at: float | None = None
        self.last_rdy_change = 0.0
        self._stream: Stream | None = None
        self._decoder = FrameDecoder(config.max_frame_size)
        self._wlock = threading.Lock()
        self._wbuf: list[bytes] = []
        self._woken = False
        self._wake_r = self._wake_w = -1
        self._io_thread: threading.Thread | None = None
        self._io_ident: int | None = None
        self._closing = False

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state}>"

    # -- handshake (synchronous, before the I/O thread exists) ------------------------------
    def connect(self, subscribe: tuple[str, str] | None = None) -> "Connection":
        """Dial, handshake, optionally SUB (waiting for its OK), then start the I/O thread."""
        cfg = self.config
        if cfg.snappy and cfg.deflate:
            raise LocalProtocolError("snappy and deflate cannot both be enabled")
        self._stream = Stream.dial(self.address, cfg.dial_timeout)
        try:
            self._handshake()
            if subscribe is not None:
                self._stream.sendall(encode_sub(*subscribe))
                self._expect_ok("SUB")
        except BaseException:
            self._stream.close()
            self.state = CLOSED
            raise
        self._start_io()
        return self

    def _handshake(self) -> None:
        cfg, stream = self.config, self._stream
        stream.settimeout(max(cfg.dial_timeout, 5.0))
        stream.sendall(MAGIC_V2 + encode_identify(cfg.identify()))
        reply = self._read_response("IDENTIFY")
        if reply != OK:
            try:
                self.features = json.loads(reply)
            except ValueError as e:
                raise RemoteProtocolError(f"{self.address}: IDENTIFY reply is not JSON: {reply[:60]!r}") from e
        f = self.features
        self.max_rdy_count = int(f.get("max_rdy_count", 2500))
        self.msg_timeout = f.get("msg_timeout", 60000) / 1000.0
        if cfg.tls.enabled and not f.get("tls_v1"):
            raise TransportError("TLS was asked for but nsqd does not offer it (start nsqd with "
                                 "--tls-cert/--tls-key)", self.address)
        if f.get("tls_v1"):
            stream.upgrade_tls(cfg.tls, max(cfg.dial_timeout, 5.0))
            self._expect_ok("TLS upgrade")
        for kind in ("snappy", "deflate"):
            if f.get(kind):
                leftover = self._decoder.take_buffered()
                stream.upgrade_compression(kind, int(f.get("deflate_level", cfg.deflate_level)))
                self._decoder.receive_data(stream.decompress(leftover))
                self._expect_ok(f"{kind} upgrade")
        if f.get("auth_required"):
            self._authenticate()
        stream.enter_io_mode(cfg.write_timeout)
        self.state = CONNECTED
        self.connected_at = time.time()

    def _authenticate(self) -> None:
        if not self.config.auth_secret:
            raise AuthError("nsqd requires authentication: give --auth-secret "
                            "(or NSQCLI_AUTH_SECRET)", self.address, code="E_AUTH_REQUIRED")
        self._stream.sendall(encode_auth(self.config.auth_secret))
        reply = self._read_response("AUTH")
        try:
            self.auth_info = json.loads(reply)
        except ValueError as e:
            raise RemoteProtocolError(f"{self.address}: AUTH reply is not JSON: {reply[:60]!r}") from e

    def _read_response(self, what: str) -> bytes:
        """Next non-heartbeat frame during the handshake; error frames raise."""
        while True:
            frame = self._decoder.next_frame()
            if frame is NEED_DATA:
                try:
                    data = self._stream.recv()
                except Timeout as e:
                    raise Timeout(f"no answer to {what}", self.address) from e
                if data is None:
                    raise ReadError(f"connection closed by nsqd during {what}", self.address)
                self._decoder.receive_data(data)
                continue
            if frame.type == FRAME_ERROR:
                err = server_error(frame.data, self.address)
                raise err
            if frame.type == FRAME_MESSAGE:
                raise RemoteProtocolError(f"{self.address}: message frame during {what}")
            if frame.data == HEARTBEAT:
                self._stream.sendall(NOP)
                continue
            return frame.data

    def _expect_ok(self, what: str) -> None:
        reply = self._read_response(what)
        if reply != OK:
            raise RemoteProtocolError(f"{self.address}: expected OK after {what}, got {reply[:60]!r}")

    # -- the I/O thread -------------------------------------------------------------------
    def _start_io(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._io_thread = threading.Thread(target=self._io_main, name=f"nsqcli-io-{self.address}",
                                           daemon=True)
        self._io_thread.start()

    def _io_main(self) -> None:
        self._io_ident = threading.get_ident()
        error: BaseException | None = None
        try:
            self._io_loop()
        except (NSQError, OSError) as e:
            error = e
        except BaseException as e:  # a bug: report it, never vanish silently
            error = e
        finally:
            self._shutdown(error)

    def _io_loop(self) -> None:
        stream, decoder, delegate = self._stream, self._decoder, self.delegate
        sel = selectors.DefaultSelector()
        sel.register(stream.fileno(), selectors.EVENT_READ, "sock")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        hb = self.config.heartbeat_interval
        stale_after = 2 * hb + 5.0 if hb > 0 else self.config.read_timeout
        last_read = time.monotonic()
        try:
            while not self._closing or self._wbuf:
                self._flush()
                if self._closing:
                    break
                if stream.pending():
                    events = [(None, "sock")]
                else:
                    events = [(k.data, k.data) for k, _ in sel.select(1.0)]
                for _, kind in events:
                    if kind == "wake":
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                        continue
                    data = stream.recv()
                    if data is None:
                        if self.close_wait_event.is_set():
                            return
                        raise ReadError("connection closed by nsqd", self.address)
                    last_read = time.monotonic()
                    decoder.receive_data(data)
                    items = decoder.decode_all(self.responder)
                    if items:
                        self._dispatch(items, delegate)
                if time.monotonic() - last_read > stale_after:
                    raise Timeout(f"no data (not even a heartbeat) for {stale_after:.0f}s", self.address)
            self._linger(sel)
        finally:
            sel.close()

    def _linger(self, sel, timeout: float = 2.0) -> None:
        """Close politely: half-close, then read until nsqd closes its side. Closing with unread
        bytes in our receive buffer sends a RST, and a RST can make nsqd drop the FIN/REQ it
        has not read yet. Messages that still arrive now cannot be answered: counted in
        ``late_messages``; nsqd redelivers them after its message timeout."""
        stream = self._stream
        try:
            stream.shutdown_write()
        except OSError:
            return
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not stream.pending() and not sel.select(left):
                return
            try:
                data = stream.recv()
            except NSQError:
                return
            if data is None:
                return
            self._decoder.receive_data(data)
            try:
                self.late_messages += sum(type(x) is Message for x in self._decoder.decode_all())
            except RemoteProtocolError:
                return

    def _dispatch(self, items: list, delegate) -> None:
        msgs = None
        for item in items:
            if type(item) is Message:
                if msgs is None:
                    msgs = []
                msgs.append(item)
                continue
            if msgs:
                self._deliver(msgs, delegate)
                msgs = None
            if item.type == FRAME_ERROR:
                err = server_error(item.data, self.address)
                if err.fatal:  # nsqd closes the connection after this: stop offering it now
                    self._closing = True
                    self.state = CLOSING
                delegate.on_error(self, err)
                if err.fatal:
                    raise err
            elif item.data == HEARTBEAT:
                self.heartbeats += 1
                self._wbuf.append(NOP)
            elif item.data == CLOSE_WAIT:
                self.state = CLOSING
                self.close_wait_event.set()
                delegate.on_response(self, item.data)
            else:
                delegate.on_response(self, item.data)
        if msgs:
            self._deliver(msgs, delegate)

    def _deliver(self, msgs: list, delegate) -> None:
        self.received += len(msgs)
        self.last_message = time.time()
        delegate.on_messages(self, msgs)

    def _flush(self) -> None:
        if not self._wbuf:
            return
        with self._wlock:
            buf, self._wbuf = self._wbuf, []
            self._woken = False
        self._stream.sendall(buf[0] if len(buf) == 1 else b"".join(buf))

    def _shutdown(self, error: BaseException | None) -> None:
        self.state = CLOSED
        self.close_error = error
        self._stream.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1
        self.closed_event.set()
        try:
            self.delegate.on_close(self, error)
        except Exception:
            pass

    # -- API for any thread ------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Queue bytes for the I/O thread; they go out coalesced with other queued commands."""
        if self.state == CLOSED:
            raise TransportError("connection is closed", self.address)
        with self._wlock:
            self._wbuf.append(data)
            if self._woken or threading.get_ident() == self._io_ident:
                return
            self._woken = True
            wake = self._wake_w
        try:
            os.write(wake, b"w")
        except OSError:
            pass

    def send_cls(self) -> None:
        """Ask nsqd to stop sending messages (it answers CLOSE_WAIT)."""
        if self.state == CONNECTED:
            self.write(CLS)

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued, close the socket and join the I/O thread."""
        if self._io_thread is None:
            if self._stream:
                self._stream.close()
            self.state = CLOSED
            return
        self._closing = True
        if self.state != CLOSED:
            try:
                self.write(b"")
            except TransportError:
                pass
        if threading.get_ident() != self._io_ident:
            self._io_thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.state in (CONNECTED, CLOSING) and not self._closing

    def snapshot(self, backoff: str = "", in_flight: int = 0) -> ConnStats:
        """In-flight counts live in the consumer's flow control, which passes them in."""
        return ConnStats(self.address, self.state, self.rdy, in_flight, self.received,
                         self.finished, self.requeued, self.timed_out, self.last_message,
                         self.connected_at, dict(self.features), backoff)
