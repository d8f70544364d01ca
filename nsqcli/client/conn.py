"""Connection: one link to one nsqd. I/O only: the protocol state lives in the pure
:class:`nsqcli.protocol.session.Session` (after :class:`~nsqcli.protocol.session.Handshake`).

Lifecycle: dial -> magic "  V2" -> IDENTIFY (feature negotiation) -> TLS -> snappy|deflate ->
AUTH -> (SUB/PUB...) -> CLS -> CLOSE_WAIT -> close.

Threading: after the handshake ONE I/O thread reads: it decodes frames and feeds them to the
session (which queues the NOP for a heartbeat and matches each publish to its answer).
``write()`` / ``send()`` pass the command through the session and append its bytes to a buffer
under one lock. Who sends that buffer: on TLS or compression, and for publishes, the I/O
thread, woken through a pipe, so every command written between two wake-ups goes out in one
``send``; on plain TCP a FIN/REQ/TOUCH/RDY goes out at once from the writer's own thread (a
handler's batch of FINs is one ``send``) - but only what the socket takes without waiting: the
rest, or everything when another thread is sending, is left at the head of the buffer for the
I/O thread, so a writer never blocks (it may hold the consumer's lock). The send lock makes
"take the buffer, send it" one step: commands leave in the order they were queued.

A publish is sent with a token (a :class:`~nsqcli.client.producer.Future`): the connection
that sent it resolves it - OK, nsqd's error, or a TransportError when the connection closed
first (``not_processed`` True when nsqd certainly did not publish it). Nothing else can answer
it: a replacement connection to the same address has its own session.

The delegate (:class:`ConnectionDelegate`: Consumer, Producer) hears from the I/O thread.
"""

from __future__ import annotations

import os
import selectors
import threading
import time

from .config import Config
from ..errors import (LocalProtocolError, NSQError, ReadError, RemoteProtocolError, ServerError, Timeout,
                      TransportError)
from ..protocol import NEED_DATA, FrameDecoder
from ..protocol.commands import CLS
from ..protocol.constants import CLOSE_WAIT
from ..protocol.session import (CLOSE_WAIT_EVENT, MUST_CLOSE, NOT_PROCESSED, Answered, Handshake, Negotiated, ServerErrorEvent,
                                Session, Unanswered, Upgrade)
from .message import Message
from .record import Record, field
from .transport import Stream


# states
INIT, CONNECTED, CLOSING, CLOSED = "init", "connected", "closing", "closed"


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


class ConnectionDelegate:
    """What a Connection tells its owner (go-nsq's delegates.go), always on the connection's
    I/O thread; none of these may block. The defaults do nothing."""

    def on_messages(self, conn: "Connection", msgs: list, nbytes: int) -> None:
        """Messages arrived (one recv's worth, in order)."""

    def on_response(self, conn: "Connection", data: bytes) -> None:
        """A response that answers no publish (CLOSE_WAIT)."""

    def on_server_error(self, conn: "Connection", err: NSQError) -> None:
        """An error frame that answers no publish (E_FIN_FAILED, ...; fatal ones close next)."""

    def on_close(self, conn: "Connection", error: BaseException | None) -> None:
        """The connection is closed (``error`` None after a clean close); its publishes are
        already resolved."""


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
        self.late_messages = 0
        self.last_message: float | None = None
        self.connected_at: float | None = None
        self.last_rdy_change = 0.0
        self.session = Session(address)
        self._stream: Stream | None = None
        self._decoder = FrameDecoder(config.max_frame_size)
        self._wlock = threading.Lock()
        self._wbuf: list[bytes] = []
        # whoever takes the queued bytes sends them before anyone takes more: commands go out in
        # the order they were queued, from the I/O thread or (plain TCP) the writer's own thread
        self._send_lock = threading.Lock()
        self._direct = False     # set after the handshake: plain TCP only (see _send_now())
        self._send_error: TransportError | None = None
        self._woken = False
        self._wake_r = self._wake_w = -1
        self._io_thread: threading.Thread | None = None
        self._io_ident: int | None = None
        self._closing = False

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state}>"

    @property
    def heartbeats(self) -> int:
        return self.session.heartbeats

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
        self.session.subscribed = subscribe is not None
        identify = cfg.identify()
        self._stream = self._dial(self.address, min(cfg.dial_timeout, end - now))
        try:
            try:
                self._handshake(Handshake(identify, cfg.auth_secret, subscribe, self.address), end)
            except ServerError as e:
                if cfg.output_buffer_size is not None or "output buffer size" not in str(e):
                    raise
                # the 64 KiB buffer Config asks for on its own (see Config.output_buffer_size) is
                # above this nsqd's --max-output-buffer-size: again, with nsqd's default
                self._stream.close()
                del identify["output_buffer_size"]
                self._decoder = FrameDecoder(cfg.max_frame_size)
                self._stream = self._dial(self.address, min(cfg.dial_timeout, self._remaining(end, "IDENTIFY")))
                self._handshake(Handshake(identify, cfg.auth_secret, subscribe, self.address), end)
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
        # other threads may send directly on a plain socket only: one SSL object must not read
        # in one thread while writing in another, and a compressed stream cannot hand a
        # half-sent compressed remainder back to the queue
        self._direct = self._stream.plain
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
            # frames read with the handshake's reply came before anything queued was written:
            # they cannot answer it
            self._dispatch_buffered(delegate)
            if decoder.error is not None:
                raise decoder.error
            while not self._closing or self._wbuf:
                try:
                    self._flush()
                    if self._send_error is not None:  # a writer's own send failed
                        raise self._send_error
                except TransportError as e:
                    self._drain(sel, delegate)
                    raise e
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
                    self._dispatch_buffered(delegate)
                    if decoder.error is not None:  # garbage after good frames: fail now, not
                        raise decoder.error        # when (if ever) more data arrives
                if time.monotonic() - last_read > stale_after:
                    raise Timeout(f"no data (not even a heartbeat) for {stale_after:.0f}s", self.address)
            self._linger(sel)
        finally:
            sel.close()

    def _drain(self, sel, delegate) -> None:
        """A write failed (nsqd closed after an error, often with a RST): what nsqd said before
        closing is still in our receive buffer - the OKs of earlier publishes and the error
        that explains the close. Read and dispatch it (a fatal error frame raises) so that no
        acknowledged publish is reported unknown and resent."""
        for _ in self._read_until_eof(sel):
            self._dispatch_buffered(delegate)

    def _linger(self, sel) -> None:
        """Close politely: half-close, then read until nsqd closes its side. Closing with unread
        bytes in our receive buffer sends a RST, and a RST can make nsqd drop the FIN/REQ it
        has not read yet. Messages that still arrive now cannot be answered: counted in
        ``late_messages``; nsqd redelivers them after its message timeout."""
        try:
            with self._send_lock:  # after a writer's send in progress, never in the middle of it
                self._stream.shutdown_write()
        except OSError:
            return
        for _ in self._read_until_eof(sel):
            try:
                with self._wlock:
                    msgs, frames, _ = self._decoder.decode(None, Message)
                    events = self.session.receive_frames(frames, bool(msgs))
            except RemoteProtocolError:
                return
            self.late_messages += len(msgs)
            for event in events:  # a publish answered while we close still counts
                if type(event) is Answered:
                    _resolve(event.token, event.error)

    def _read_until_eof(self, sel, timeout: float = 2.0):
        """Feed the decoder until nsqd closes (or fails, or ``timeout`` passes); yields after
        each read."""
        stream = self._stream
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
            yield

    def _dispatch_buffered(self, delegate) -> None:
        """Decode every whole frame received and dispatch them."""
        msgs, frames, nbytes = self._decoder.decode(self.responder, Message)
        if msgs or frames:
            self._dispatch(msgs, frames, nbytes, delegate)

    def _dispatch(self, msgs: list, frames: list, nbytes: int, delegate) -> None:
        """Frames through the session (under the write lock: publishes are matched in the
        order they were written), then messages to the delegate, then the events."""
        with self._wlock:
            events = self.session.receive_frames(frames, bool(msgs))
            nops = self.session.data_to_send()
            if nops:
                self._wbuf += nops
            if self.session.state == MUST_CLOSE:  # before any future is resolved: whoever
                self._closing = True              # wakes on it must not reuse this connection
                self.state = CLOSING
        if msgs:
            self._deliver(msgs, nbytes, delegate)
        fatal = None
        for event in events:
            if type(event) is Answered:
                _resolve(event.token, event.error)
            elif type(event) is Unanswered:
                _resolve(event.token, self._unanswered(event.reason, fatal))
            elif event is CLOSE_WAIT_EVENT:
                self.state = CLOSING
                self.close_wait_event.set()
                delegate.on_response(self, CLOSE_WAIT)
            else:  # ServerErrorEvent
                delegate.on_server_error(self, event.error)
            if type(event) is Answered and event.error is not None:
                fatal = event.error  # an E_* to a publish is fatal; so is an answer that is not OK
            elif type(event) is ServerErrorEvent and event.fatal:
                fatal = event.error
        if fatal is not None:  # nsqd closes the connection after this
            self._closing = True
            self.state = CLOSING
            raise fatal

    def _unanswered(self, reason: str, cause: BaseException | None, closing: bool = False) -> TransportError:
        """The error for a publish that got no answer. ``not_processed`` says nsqd certainly
        did not publish it (never written, or written after the command nsqd failed on)."""
        if reason == NOT_PROCESSED:
            why = (f"not sent: the connection closed first ({cause or 'closed'})" if closing else
                   f"not processed: nsqd closed the connection after an earlier error ({cause})")
            err = TransportError(why, self.address)
            err.not_processed = True
            return err
        err = TransportError(f"connection lost before nsqd answered ({cause or 'closed'})", self.address)
        err.not_processed = False
        return err

    def _deliver(self, msgs: list, nbytes: int, delegate) -> None:
        self.received += len(msgs)
        self.last_message = time.time()
        delegate.on_messages(self, msgs, nbytes)

    def _flush(self) -> None:
        """The I/O thread sends everything queued (blocking, bounded by the write timeout)."""
        if not self._wbuf and not self._woken:
            return
        with self._send_lock:
            with self._wlock:
                # a wake-up is used up even when a writer's own send took the queue meanwhile:
                # left set, no later write would wake this thread again
                self._woken = False
                if not self._wbuf or self.state == CLOSED:
                    return
                buf, self._wbuf = self._wbuf, []
                self.session.flushed()  # their answers may come from now on
            try:
                self._stream.sendall(buf[0] if len(buf) == 1 else b"".join(buf))
            except TransportError as e:
                self._broken(e)
                raise

    def _broken(self, e: TransportError) -> None:
        """A send failed, maybe half-way through a command: nothing more may be written on this
        stream (it would be read as garbage - nsqd answered "invalid command TOUCHFIN" - while
        the writer counted it sent). Writers get TransportError from now on; the I/O thread,
        woken, closes the connection with this error."""
        with self._wlock:
            if self._send_error is None:
                self._send_error = e
            self._wake()

    def _shutdown(self, error: BaseException | None) -> None:
        with self._wlock:  # no writer can queue (or wake through a reused fd) from here on
            self.state = CLOSED
            lost = self.session.connection_lost()
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._wake_r = self._wake_w = -1
        self.close_error = error
        with self._send_lock:  # a writer's send in progress ends first (its fd is not reused under it)
            self._stream.close()
        for event in lost:
            _resolve(event.token, self._unanswered(event.reason, error, closing=True))
        self.closed_event.set()
        try:
            self.delegate.on_close(self, error)
        except Exception:
            pass

    # -- API for any thread ------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send a command that gets no answer (FIN, RDY, REQ, TOUCH, CLS...): on plain TCP from
        this thread, at once (with whatever else is queued); on TLS or a compressed stream
        through the I/O thread.
        Raises TransportError when the connection is closed or the send failed."""
        self.send(data)

    def send(self, command: bytes, token=None) -> None:
        """Queue ``command``; a publish needs a ``token`` (set_result/set_exception), resolved
        by this connection alone. Raises TransportError (nothing queued) when the connection
        is closed or closing after a fatal error."""
        with self._wlock:
            if self.state == CLOSED:
                raise TransportError("connection is closed", self.address)
            if self._send_error is not None:
                raise TransportError(f"connection failed: {self._send_error}", self.address)
            try:
                data = self.session.send(command, token)
            except LocalProtocolError as e:
                raise TransportError(str(e), self.address) from None
            self._wbuf.append(data)
            if self._wake_w < 0 or threading.get_ident() == self._io_ident:
                return
            # FIN/REQ/TOUCH/RDY on plain TCP: sent now, from this thread (_send_now). Waking
            # the I/O thread to send them cost a pipe write, a select wake-up and a read per
            # batch, and kept nsqd waiting for FINs: 1M x 100 B per-message consumer 2.75-3.5 s
            # -> 2.1-2.35 s. Publishes (a token) and the close wake-up still go through the I/O
            # thread, which coalesces them.
            if not (self._direct and token is None and data and not self._closing):
                self._wake()
                return
        self._send_now()

    def _wake(self) -> None:
        """(under _wlock) Have the I/O thread send what is queued."""
        if not self._woken and self._wake_w >= 0:
            self._woken = True
            try:  # under the lock: _shutdown cannot close (and the OS reuse) this fd meanwhile
                os.write(self._wake_w, b"w")
            except OSError:
                pass

    def _send_now(self) -> None:
        """A writer's thread sends what is queued - without ever blocking: the consumer calls
        this holding its lock, and a stalled nsqd must not stall every other connection. When
        another thread is sending, or the socket takes only part of it, the rest goes back to
        the head of the queue for the I/O thread (blocking sends, write timeout) and nothing
        jumps ahead of it."""
        if not self._send_lock.acquire(blocking=False):
            with self._wlock:  # whoever sends now took the queue before ours was in it
                self._wake()
            return
        try:
            with self._wlock:
                # ours may have been taken by a send that failed, or be left in a closed queue:
                # then it was not written, and the writer must hear so (its FINs count as lost)
                if self._send_error is not None:
                    raise TransportError(f"connection failed: {self._send_error}", self.address)
                if self.state == CLOSED:
                    raise TransportError("connection is closed", self.address)
                if not self._wbuf:
                    return
                buf, self._wbuf = self._wbuf, []
                self.session.flushed()  # their answers may come from now on
            data = buf[0] if len(buf) == 1 else b"".join(buf)
            try:
                sent = self._stream.send_nowait(data)
            except TransportError as e:
                self._broken(e)
                raise
            if sent < len(data):
                with self._wlock:
                    self._wbuf.insert(0, data[sent:])
                    self._wake()
        finally:
            self._send_lock.release()

    def waiting_tokens(self) -> list:
        """The publishes sent on this connection and not answered yet, oldest first."""
        with self._wlock:
            return self.session.tokens()

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


def _resolve(token, error: BaseException | None) -> None:
    """Settle a publish's token (a Future) once."""
    if token.done():
        return
    if error is None:
        token.set_result(b"OK")
    else:
        token.set_exception(error)
