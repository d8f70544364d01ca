"""Connection: one link to one nsqd. I/O only: the protocol state lives in the pure
:class:`nsqcli.protocol.session.Session` (after :class:`~nsqcli.protocol.session.Handshake`).

Lifecycle: dial -> magic "  V2" -> IDENTIFY (feature negotiation) -> TLS -> snappy|deflate ->
AUTH -> (SUB/PUB...) -> CLS -> CLOSE_WAIT -> close. The first half - connect(), begin(), the dial
and the handshake - is in nsqcli.client.dialing (:class:`~nsqcli.client.dialing.Dialing`).

Threading: no thread of its own. An I/O loop (nsqcli.client.loop: one selector thread for
many connections) dials without blocking, drives the handshake (TLS too), reads, decodes
frames and feeds them to the session (which queues the NOP for a heartbeat and matches each
publish to its answer), and enforces every deadline (dial, handshake, stalled writes, silent
reads, the linger after a close). ``send()`` passes the command through the
session and append its bytes to a buffer under one lock. Who sends that buffer: on TLS or
compression, and for publishes, the loop, woken, so every command written between two
wake-ups goes out in one ``send``; on plain TCP a FIN/REQ/TOUCH/RDY goes out at once from the
writer's own thread (a handler's batch of FINs is one ``send``) - but only what the socket
takes without waiting: the rest, or everything when another thread is sending, is the
loop's to send (it waits for the socket to be writable), so a writer never blocks (it may
hold the consumer's lock) and neither does the loop. The send lock makes "take the buffer,
send it" one step: commands leave in the order they were queued.

A publish is sent with a token (a :class:`~nsqcli.client.producer.Future`): the connection
that sent it resolves it - OK, nsqd's error, or a TransportError when the connection closed
first (``not_processed`` True when nsqd certainly did not publish it). Nothing else can answer
it: a replacement connection to the same address has its own session.

The delegate (:class:`ConnectionDelegate`: the consumer's private adapter, the producer) hears
from the I/O loop, and must not block it: every connection of the loop waits meanwhile.
"""

from __future__ import annotations

import os
import selectors
import threading
import time

from . import loop as loop_pool
from .config import Config
from .loop import is_loop_thread
from ..errors import ConnectError, LocalProtocolError, NSQError, ReadError, RemoteProtocolError, Timeout, TransportError
from ..protocol import FrameDecoder
from ..protocol.commands import CLS
from ..protocol.constants import CLOSE_WAIT
from ..protocol.session import (CLOSE_WAIT_EVENT, MUST_CLOSE, NOT_PROCESSED, Answered, Handshake, Negotiated, ServerErrorEvent,
                                Session, Unanswered)
from .dialing import CLOSED, CLOSING, CONNECTED, DONE, DRAIN, HANDSHAKE, INIT, IO, LINGER, Dialing
from .message import Message
from .transport import Stream


#: seconds to read nsqd's last words after a half-close or a failed write
LINGER_TIME = 2.0
NEVER = float("inf")


class ConnectionDelegate:
    """What a Connection tells its owner (go-nsq's delegates.go), always on its I/O loop;
    none of these may block. The defaults do nothing."""

    def on_messages(self, conn: "Connection", msgs: list, nbytes: int) -> None:
        """Messages arrived (one recv's worth, in order)."""

    def on_response(self, conn: "Connection", data: bytes) -> None:
        """A response that answers no publish (CLOSE_WAIT)."""

    def on_server_error(self, conn: "Connection", err: NSQError) -> None:
        """An error frame that answers no publish (E_FIN_FAILED, ...; fatal ones close next)."""

    def on_close(self, conn: "Connection", error: BaseException | None) -> None:
        """The connection is closed (``error`` None after a clean close); its publishes are
        already resolved."""


class Connection(Dialing):
    """One nsqd link, driven by an I/O loop (nsqcli.client.loop). :meth:`begin` starts the
    dial and handshake and returns at once; :meth:`connect` waits for them."""

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
        # attached to every message at decode (a consumer's record of this connection,
        # nsqcli.client.links.Link: it routes the message's FIN/REQ/TOUCH, and keeps the counts)
        self.responder = None
        self.late_messages = 0   # arrived after our half-close: not delivered, nsqd redelivers them
        self.connected_at: float | None = None
        self.session = Session(address)
        self._stream: Stream | None = None
        self._decoder = FrameDecoder(config.max_frame_size)
        self._wlock = threading.Lock()
        self._wbuf: list[bytes] = []
        # whoever takes the queued bytes sends them before anyone takes more: commands go out in
        # the order they were queued, from the loop or (plain TCP) the writer's own thread
        self._send_lock = threading.Lock()
        self._out = b""          # wire bytes the socket did not take yet (under _send_lock)
        self._off = 0
        self._out_since = 0.0    # when the socket last took some of _out
        self._direct = False     # set after the handshake: plain TCP only (see _send_now())
        self._send_error: TransportError | None = None
        self._woken = False
        self._closing = False
        # the loop's side
        self._loop = None
        self._phase = HANDSHAKE
        self._fd = -1
        self._events = 0
        self._end = 0.0          # handshake / linger / drain deadline
        self._connect_end = 0.0
        self._hs: Handshake | None = None
        self._hs_args: tuple = ()
        self._tls_wants: str | None = None
        self._ready = threading.Event()
        self._ready_error: BaseException | None = None
        self._on_connected = None
        self._drain_error: BaseException | None = None
        self._aborted: BaseException | None = None
        self._close_by = NEVER  # close(timeout): closed by then, lingering or not
        self._pid = os.getpid()
        self.last_read = 0.0

    def __repr__(self) -> str:
        return f"<Connection {self.address} {self.state}>"

    @property
    def heartbeats(self) -> int:
        return self.session.heartbeats

    def _forget_socket(self) -> None:
        if self._fd >= 0:
            self._loop.unregister(self, self._fd)
            self._fd = -1
        if self._stream is not None:
            with self._send_lock:
                self._stream.close()

    def _located(self, e: RemoteProtocolError) -> RemoteProtocolError:
        """The decoder does not know where its bytes came from: say it."""
        text = str(e)
        return e if text.startswith(self.address) else RemoteProtocolError(f"{self.address}: {text}")

    # -- the loop's callbacks ---------------------------------------------------------------------
    def _on_ready(self, readable: bool, writable: bool) -> None:
        try:
            phase = self._phase
            if phase == IO:
                if readable:
                    self._read()
                if self._phase == IO and (writable or self._wbuf or self._closing):
                    self._flush()
            elif phase == HANDSHAKE:
                self._hs_ready(readable, writable)
            elif phase in (LINGER, DRAIN) and readable:
                self._read_closing()
        except BaseException as e:  # a bug too: report it, never vanish silently
            self._fail(e)

    def _on_wake(self) -> None:
        try:
            if self._phase == IO:
                self._flush()
        except BaseException as e:
            self._fail(e)

    def _sweep(self, now: float) -> None:
        """Deadlines (every loop.SWEEP seconds)."""
        phase = self._phase
        try:
            if phase == HANDSHAKE:
                if getattr(self._stream, "connecting", False) and now >= self._connect_end:
                    raise Timeout(f"connect timed out after {self.config.dial_timeout}s", self.address)
                if now >= self._end:
                    raise Timeout(f"no answer to {self._waiting_for()} in time", self.address)
            elif phase == IO:
                if self._out and now - self._out_since > self.config.write_timeout:
                    self._start_drain(Timeout("write timed out", self.address))
                    return
                hb = self.config.heartbeat_interval
                stale_after = 2 * hb + 5.0 if hb > 0 else self.config.read_timeout
                if now - self.last_read > stale_after:
                    raise Timeout(f"no data (not even a heartbeat) for {stale_after:.0f}s", self.address)
            elif phase in (LINGER, DRAIN) and now >= min(self._end, self._close_by):
                self._shutdown(self._drain_error)
                return
            if phase == IO and now >= self._close_by:  # close()'s time is up: what is unsent stays so
                self._shutdown(None)
            elif phase == IO and not self._out and self._close_by == NEVER:
                self._loop.watched.discard(self)  # nothing due soon: the loop's full sweeps will do
        except BaseException as e:
            self._fail(e)

    def _watch(self) -> None:
        """A deadline is near: the loop checks this connection every SWEEP, not FULL_SWEEP."""
        loop = self._loop
        if loop is not None:
            loop.watched.add(self)

    def _fail(self, e: BaseException) -> None:
        phase = self._phase
        if phase == HANDSHAKE:
            self._handshake_failed(e)
        elif phase != DONE:
            if isinstance(e, RemoteProtocolError):
                e = self._located(e)
            self._shutdown(e)

    def _abort(self, error: BaseException) -> None:
        """From any thread: end a handshake in progress with ``error`` (a handshake that
        completes before the loop gets to it fails with it all the same)."""
        with self._wlock:
            if self._phase != HANDSHAKE:
                return
            self._aborted = error
        loop = self._loop  # read after _aborted is set: None means begin() has not picked a loop
        if loop is not None:  # yet, and its _attach will see _aborted
            loop.call(lambda: self._phase == HANDSHAKE and self._handshake_failed(error))

    def _set_events(self, events: int | None = None) -> None:
        if events is None:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self._out else 0)
        if events != self._events and self._fd >= 0:
            self._events = events
            self._loop.modify(self._fd, events, self)

    # -- reading (on the loop) ----------------------------------------------------------------
    def _read(self) -> None:
        stream, decoder = self._stream, self._decoder
        data = stream.recv()
        if data is None:
            if self.close_wait_event.is_set():
                self._shutdown(None)
                return
            raise ReadError("connection closed by nsqd", self.address)
        if data:
            self.last_read = time.monotonic()
            decoder.receive_data(data)
            self._dispatch_buffered(self.delegate)
            if decoder.error is not None:  # garbage after good frames: fail now, not
                raise decoder.error        # when (if ever) more data arrives
        if stream.pending():
            self._loop.again.add(self)

    def _read_closing(self) -> None:
        """LINGER: nsqd's last words after our half-close; DRAIN: what it said before a write
        failed (the OKs of earlier publishes, the error that explains the close)."""
        try:
            data = self._stream.recv()
        except NSQError:
            data = None
        if data is None:
            self._shutdown(self._drain_error)
            return
        if data:
            self._decoder.receive_data(data)
            if self._phase == DRAIN:
                self._dispatch_buffered(self.delegate)  # a fatal error frame raises: it wins
            else:
                self._late()
        if self._stream.pending():
            self._loop.again.add(self)

    def _late(self) -> None:
        """Messages that arrive after we half-closed cannot be answered: counted in
        ``late_messages`` (nsqd redelivers them after its message timeout); a publish answered
        while we close still counts."""
        try:
            with self._wlock:
                msgs, frames, _ = self._decoder.decode(None, Message)
                events = self.session.receive_frames(frames, bool(msgs))
        except RemoteProtocolError:
            self._shutdown(None)
            return
        self.late_messages += len(msgs)
        for event in events:
            if type(event) is Answered:
                _resolve(event.token, event.error)

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
            delegate.on_messages(self, msgs, nbytes)
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

    # -- writing (on the loop) ------------------------------------------------------------------
    def _queue_out(self, wire: bytes) -> None:
        """(under _send_lock) Append wire bytes behind what the socket has not taken."""
        if not self._out:
            self._out, self._off = wire, 0
            self._out_since = time.monotonic()
            self._watch()
        elif self._off:
            self._out, self._off = self._out[self._off:] + wire, 0
        else:
            self._out += wire

    def _send_out(self) -> None:
        """(under _send_lock) Send what the socket takes now."""
        out, off, stream = self._out, self._off, self._stream
        while off < len(out):
            n = stream.send_nowait(memoryview(out)[off:] if off else out)
            if not n:
                break
            off += n
            self._out_since = time.monotonic()
        if off >= len(out):
            self._out, self._off = b"", 0
        else:
            self._off = off

    def _flush(self) -> None:
        """Send everything queued (coalesced), as far as the socket takes it; then, when the
        connection is closing and nothing is left, half-close (LINGER)."""
        try:
            with self._send_lock:
                with self._wlock:
                    # a wake-up is used up even when a writer's own send took the queue meanwhile
                    self._woken = False
                    if self._send_error is not None:  # a writer's own send failed
                        raise self._send_error
                    data = None
                    if self._wbuf and self.state != CLOSED:
                        buf, self._wbuf = self._wbuf, []
                        self.session.flushed()  # their answers may come from now on
                        data = buf[0] if len(buf) == 1 else b"".join(buf)
                if data:
                    self._queue_out(self._stream.encode(data))
                if self._out:
                    self._send_out()
        except TransportError as e:
            self._start_drain(e)
            return
        self._set_events()
        if self._closing and not self._out and not self._wbuf:
            self._start_linger()

    def _start_drain(self, e: TransportError) -> None:
        """A write failed (nsqd closed after an error, often with a RST): what nsqd said before
        closing is still in our receive buffer - the OKs of earlier publishes and the error
        that explains the close. Read and dispatch it (a fatal error frame wins) so that no
        acknowledged publish is reported unknown and resent; then close with ``e``."""
        with self._wlock:
            if self._send_error is None:
                self._send_error = e
            self._phase = DRAIN
        self._drain_error = e
        self._end = time.monotonic() + LINGER_TIME
        self._watch()
        self._set_events(selectors.EVENT_READ)
        if self._stream.pending():
            self._loop.again.add(self)

    def _start_linger(self) -> None:
        """Close politely: half-close, then read until nsqd closes its side. Closing with unread
        bytes in our receive buffer sends a RST, and a RST can make nsqd drop the FIN/REQ it
        has not read yet. A publishing connection whose every command nsqd answered has nothing
        nsqd could drop: it closes at once (a network that holds the close back, toxiproxy's
        slow_close, cost every pub/mpub 2 s)."""
        try:
            with self._send_lock:  # after a writer's send in progress, never in the middle of it
                self._stream.shutdown_write()
        except OSError:
            self._shutdown(None)
            return
        if not self.session.subscribed and not self.session.waiting:
            self._shutdown(None)
            return
        self._phase = LINGER
        self._end = time.monotonic() + LINGER_TIME
        self._watch()
        self._set_events(selectors.EVENT_READ)

    def _shutdown(self, error: BaseException | None) -> None:
        with self._wlock:  # no writer can queue from here on
            if self._phase == DONE:
                return
            self._phase = DONE
            self.state = CLOSED
            lost = self.session.connection_lost()
        self.close_error = error
        self._forget_socket()  # after a writer's send in progress (its fd is not reused under it)
        loop_pool.release(self._loop)
        for event in lost:
            _resolve(event.token, self._unanswered(event.reason, error, closing=True))
        self.closed_event.set()
        try:
            self.delegate.on_close(self, error)
        except Exception:
            pass

    # -- API for any thread ------------------------------------------------------------------
    def send(self, command: bytes, token=None) -> None:
        """Queue ``command``; a publish needs a ``token`` (set_result/set_exception), resolved
        by this connection alone; a command that gets no answer (FIN, RDY, REQ, TOUCH, CLS) has
        none and goes out at once on plain TCP from this thread (with whatever else is queued),
        through the loop on TLS or a compressed stream. Raises TransportError (nothing queued)
        when the connection is closed or closing after a fatal error. Before the handshake is
        done, commands wait for it."""
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
            if self._phase != IO:
                return
            # FIN/REQ/TOUCH/RDY on plain TCP: sent now, from this thread (_send_now): no
            # hand-over to the loop (a pipe write, a select wake-up, a read per batch), and no
            # wait for nsqd. Publishes (a token) and the close wake-up go through the loop,
            # which coalesces them.
            if not (self._direct and token is None and data and not self._closing):
                self._wake()
                return
        self._send_now()

    def _wake(self) -> None:
        """(under _wlock) Have the loop send what is queued."""
        if not self._woken and self._loop is not None:
            self._woken = True
            self._loop.wake(self)

    def _send_now(self) -> None:
        """A writer's thread sends what is queued - without ever blocking: the consumer calls
        this holding its lock, and a stalled nsqd must not stall every other connection. When
        another thread is sending, the loop has bytes the socket did not take, or the socket
        takes only part of it, the rest is the loop's to send, and nothing jumps ahead of it."""
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
                if self._out:  # the loop's backlog goes first
                    self._wake()
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
                self._queue_out(data[sent:])
                with self._wlock:
                    self._wake()
        finally:
            self._send_lock.release()

    def _broken(self, e: TransportError) -> None:
        """A writer's send failed, maybe half-way through a command: nothing more may be
        written on this stream (it would be read as garbage - nsqd answered "invalid command
        TOUCHFIN" - while the writer counted it sent). Writers get TransportError from now on;
        the loop, woken, closes the connection with this error."""
        with self._wlock:
            if self._send_error is None:
                self._send_error = e
            self._wake()

    def waiting_tokens(self) -> list:
        """The publishes sent on this connection and not answered yet, oldest first."""
        with self._wlock:
            return self.session.tokens()

    def abort(self) -> None:
        """From another thread: make a handshake in progress fail at once."""
        if self._phase == HANDSHAKE:
            self._abort(ConnectError("connection attempt aborted", self.address))

    def send_cls(self) -> None:
        """Ask nsqd to stop sending messages (it answers CLOSE_WAIT)."""
        if self.state == CONNECTED:
            self.send(CLS)

    def close(self, timeout: float = 5.0, wait: bool = True) -> None:
        """Send what is queued, half-close, read nsqd's last words, close - all within
        ``timeout``: then the connection is closed whatever is left (publishes still waiting
        are answered with a TransportError). With ``wait`` (never on an I/O loop thread),
        returns once it is closed."""
        if self._loop is None:
            if self._stream:
                self._stream.close()
            self.state = CLOSED
            return
        self._close_by = min(self._close_by, time.monotonic() + max(0.0, timeout))
        self._watch()
        if self._phase == HANDSHAKE:
            self.abort()
        else:
            with self._wlock:
                self._closing = True
                if self.state != CLOSED:
                    self._wake()
        if wait and not is_loop_thread():
            self.closed_event.wait(max(0.0, timeout) + 3 * loop_pool.SWEEP)

    @property
    def alive(self) -> bool:
        """Usable: connected, not closing, and opened by this process (after os.fork the
        child must make its own: the loop that drives this one is not in the child)."""
        return self.state in (CONNECTED, CLOSING) and not self._closing and self._pid == os.getpid()


def _resolve(token, error: BaseException | None) -> None:
    """Settle a publish's token (a Future) once."""
    if token.done():
        return
    if error is None:
        token.set_result(b"OK")
    else:
        token.set_exception(error)
