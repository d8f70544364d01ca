"""Connection: one link to one nsqd.

Lifecycle: dial -> magic "  V2" -> IDENTIFY (feature negotiation) -> TLS -> snappy|deflate ->
AUTH -> (SUB/PUB...) -> CLS -> CLOSE_WAIT -> close.

Threading: after the handshake ONE I/O thread owns the socket. It reads, decodes frames,
answers heartbeats with NOP at once, hands messages/responses to the delegate, and writes.
Other threads never touch the socket: ``write()`` appends to a buffer and wakes the I/O thread
through a pipe, so every command written between two wake-ups goes out in one ``send`` (many
FIN/RDY coalesced, compressed once) and TLS is never read and written concurrently.

The delegate (Producer or Consumer) receives, on the I/O thread:
``on_messages(conn, [Message])``, ``on_response(conn, bytes)``,
``on_server_error(conn, ServerError)``, ``on_close(conn, error_or_None)``. It must not block.
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from dataclasses import dataclass, field

from .config import Config
from ..errors import (LocalProtocolError, NSQError, ReadError, RemoteProtocolError, Timeout,
                      TransportError, server_error)
from ..protocol import FRAME_ERROR, NEED_DATA, FrameDecoder
from ..protocol.commands import CLS, NOP
from ..protocol.constants import CLOSE_WAIT, HEARTBEAT
from ..protocol.session import Handshake, Negotiated, Upgrade
from .message import Message
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
    lost: int = 0            # FIN/REQ not delivered (connection gone)
    late: int = 0            # messages that arrived after CLS, left for nsqd to redeliver


class Connection:
    """One nsqd link. ``connect()`` does the handshake synchronously, then starts the I/O thread."""

    def __init__(self, address: str, config: Config, delegate, name: str = "nsqcli",
                 dial=None):
        self.address = address
        self._dial = dial or Stream.dial  # (address, timeout) -> a stream (see nsqcli.client.transport)
        self.negotiated = Negotiated()
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
        self.lost = 0            # FIN/REQ that could not be written: the connection was gone
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
    def connect(self, subscribe: tuple[str, str] | None = None, deadline: float | None = None,
                start_io: bool = True) -> "Connection":
        """Dial, handshake (nsqcli.protocol.session), optionally SUB, then start the I/O thread.

        The whole of it is bounded by ``dial_timeout + handshake_timeout`` and by ``deadline``
        (time.monotonic()), however slowly nsqd answers. With ``start_io=False`` the caller
        prepares (RDY queued with write()) and calls :meth:`start_io` itself."""
        cfg = self.config
        if cfg.snappy and cfg.deflate:
            raise LocalProtocolError("snappy and deflate cannot both be enabled")
        now = time.monotonic()
        end = now + cfg.dial_timeout + cfg.handshake_timeout
        if deadline is not None:
            end = min(end, deadline)
        if end <= now:
            raise Timeout("deadline passed before connecting", self.address)
        self._stream = self._dial(self.address, min(cfg.dial_timeout, end - now))
        try:
            self._handshake(Handshake(cfg.identify(), cfg.auth_secret, subscribe, self.address), end)
        except RemoteProtocolError as e:
            self._stream.close()
            self.state = CLOSED
            raise self._located(e) from None
        except BaseException:
            self._stream.close()
            self.state = CLOSED
            raise
        if start_io:
            self.start_io()
        return self

    def _handshake(self, hs: Handshake, end: float) -> None:
        self._send_before(hs.start(), end)
        while not hs.done:
            frame = self._decoder.next_frame()
            if frame is NEED_DATA:
                self._recv_before(end, hs.waiting_for)
                continue
            for action in hs.receive_frame(frame.type, frame.data):
                if isinstance(action, Upgrade):
                    self._upgrade(action, end)
                else:
                    self._send_before(action, end)
        n = hs.negotiated
        self.negotiated = n
        self.features = n.features
        self.max_rdy_count = n.max_rdy_count
        self.msg_timeout = n.msg_timeout
        self.auth_info = hs.auth_info
        self._stream.enter_io_mode(self.config.write_timeout)
        if self.config.auth_secret and not n.auth_required and self.config.on_notice is not None:
            self.config.on_notice(f"nsqd {self.address} does not use AUTH: the --auth-secret was not sent "
                                  "(is this the cluster you meant?)")
        self.state = CONNECTED
        self.connected_at = time.time()

    def _located(self, e: RemoteProtocolError) -> RemoteProtocolError:
        """The decoder does not know where its bytes came from: say it."""
        text = str(e)
        return e if text.startswith(self.address) else RemoteProtocolError(f"{self.address}: {text}")

    def _remaining(self, end: float, what: str) -> float:
        left = end - time.monotonic()
        if left <= 0:
            raise Timeout(f"no answer to {what} in time", self.address)
        return left

    def _send_before(self, data: bytes, end: float) -> None:
        self._stream.settimeout(self._remaining(end, "the handshake"))
        self._stream.sendall(data)

    def _recv_before(self, end: float, what: str) -> None:
        self._stream.settimeout(self._remaining(end, what))
        try:
            data = self._stream.recv()
        except Timeout as e:
            raise Timeout(f"no answer to {what} in time", self.address) from e
        if data is None:
            raise ReadError(f"connection closed by nsqd during {what}", self.address)
        self._decoder.receive_data(data)

    def _upgrade(self, up: Upgrade, end: float) -> None:
        if up.kind == "tls":
            self._stream.upgrade_tls(self.config.tls, self._remaining(end, "the TLS handshake"))
            return
        leftover = self._decoder.take_buffered()  # after the reply: already compressed bytes
        self._stream.upgrade_compression(up.kind, up.level)
        self._decoder.receive_data(self._stream.decompress(leftover))

    # -- the I/O thread -------------------------------------------------------------------
    def start_io(self) -> None:
        """Hand the socket to the I/O thread (commands queued with write() go out first)."""
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
        except RemoteProtocolError as e:
            error = self._located(e)
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
            self._flush()
            items = decoder.decode_all(self.responder, Message)  # frames read with the handshake's reply
            if items:
                self._dispatch(items, delegate)
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
                    items = decoder.decode_all(self.responder, Message)
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
                self.late_messages += sum(type(x) is Message for x in self._decoder.decode_all(None, Message))
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
                delegate.on_server_error(self, err)
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

    def abort(self) -> None:
        """From another thread: make a handshake in progress fail at once (close the socket)."""
        if self._stream is not None and self._io_thread is None:
            self._stream.close()

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
                         self.connected_at, dict(self.features), backoff, self.lost,
                         self.late_messages)
