"""A Connection's first phase (nsqcli.client.conn): dial without blocking, then, on its I/O
loop, the handshake - magic, IDENTIFY, TLS, snappy|deflate, AUTH, SUB - driven by the pure
:class:`~nsqcli.protocol.session.Handshake`; an nsqd that refuses an output buffer size or
timeout Config chose on its own is dialed again without it. When it ends, the owner's
``on_connected(conn, error)`` runs on the loop. Also the states and loop phases every part of
a Connection uses.

:class:`Dialing` is one half of :class:`~nsqcli.client.conn.Connection` (it uses the
connection's stream, decoder, send queue and loop), kept apart so that each file reads as one
phase.
"""

from __future__ import annotations

import selectors
import time

from . import limits
from . import loop as loop_pool
from .loop import is_loop_thread
from ..errors import LocalProtocolError, ReadError, RemoteProtocolError, ServerError, Timeout
from ..protocol import NEED_DATA, FrameDecoder
from ..protocol.session import Handshake, Upgrade, refused_identify_field

# states
INIT, CONNECTED, CLOSING, CLOSED = "init", "connected", "closing", "closed"
# what the loop is doing with a connection
HANDSHAKE, IO, LINGER, DRAIN, DONE = "handshake", "io", "linger", "drain", "done"


def _log():
    """The logger, imported when first needed: `nsqcli pub` never loads logging."""
    import logging

    return logging.getLogger("nsqcli.client.conn")


class Dialing:
    """Connection's dial and handshake."""

    # -- starting (any thread) ----------------------------------------------------------------
    def connect(self, subscribe: tuple[str, str] | None = None, deadline: float | None = None) -> "Connection":
        """Dial, handshake (nsqcli.protocol.session), optionally SUB; returns when connected.

        The whole of it is bounded by ``dial_timeout + handshake_timeout`` and by ``deadline``
        (time.monotonic()), however slowly nsqd answers. Raises what stopped it."""
        if is_loop_thread():
            raise RuntimeError("Connection.connect() would wait for the I/O loop it runs on: use begin()")
        self.begin(subscribe, deadline)
        try:
            if not self._ready.wait(max(0.0, self._end - time.monotonic()) + 1.0):
                self._abort(Timeout(f"no answer to {self._waiting_for()} in time", self.address))
                self._ready.wait(1.0)
        except BaseException:  # a signal (Ctrl-C) while waiting: nothing may stay half-open
            self.abort()
            raise
        if self._ready_error is not None:
            raise self._ready_error
        return self

    def begin(self, subscribe: tuple[str, str] | None = None, deadline: float | None = None,
              on_connected=None) -> None:
        """Start the dial and handshake on an I/O loop and return at once. When they end,
        ``on_connected(conn, error)`` runs on the loop (``error`` None: connected), and
        nothing else may be written until then (commands queued meanwhile go out first).
        Raises at once what fails before any I/O (bad names, no socket)."""
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
        identify = limits.fit_identify(self.address, cfg.identify())
        self._hs_args = (identify, cfg.auth_secret, subscribe, self.address)
        self._hs = Handshake(*self._hs_args)  # checks the names before any I/O
        self._end = end
        self._on_connected = on_connected
        self._dial_now()
        self._loop = loop_pool.pick()
        self._loop.call(self._attach)

    def _dial_now(self) -> None:
        now = time.monotonic()
        timeout = min(self.config.dial_timeout, self._end - now)
        self._connect_end = now + timeout
        self._stream = self._dial(self.address, timeout)

    # -- the handshake (on the loop) ----------------------------------------------------------
    def _attach(self) -> None:
        if self._phase != HANDSHAKE:  # aborted before the loop got to it
            return
        if self._aborted is not None:  # aborted before begin() had picked this loop
            self._handshake_failed(self._aborted)
            return
        try:
            self._fd = self._stream.fileno()
            connecting = getattr(self._stream, "connecting", False)
            self._events = selectors.EVENT_WRITE if connecting else selectors.EVENT_READ
            self._loop.register(self, self._fd, self._events)
            if not connecting:
                self._hs_send(self._hs.start())
        except BaseException as e:
            self._handshake_failed(e)

    def _waiting_for(self) -> str:
        hs = self._hs
        return hs.waiting_for if hs is not None else "the handshake"

    def _hs_send(self, data: bytes) -> None:
        with self._send_lock:
            self._queue_out(self._stream.encode(data))
            self._send_out()
        self._set_events()

    def _hs_ready(self, readable: bool, writable: bool) -> None:
        stream = self._stream
        if getattr(stream, "connecting", False):
            if writable:
                stream.finish_connect()
                self._hs_send(self._hs.start())
            return
        if self._tls_wants is not None:
            self._tls_step()
            if self._tls_wants is not None:
                return
        if writable and self._out:
            with self._send_lock:
                self._send_out()
            self._set_events()
        if readable:
            data = stream.recv()
            if data is None:
                raise ReadError(f"connection closed by nsqd during {self._waiting_for()}", self.address)
            if data:
                self._decoder.receive_data(data)
        self._hs_frames()

    def _hs_frames(self) -> None:
        hs, decoder = self._hs, self._decoder
        while not hs.done:
            frame = decoder.next_frame()
            if frame is NEED_DATA:
                if self._stream.pending():
                    self._loop.again.add(self)
                return
            for action in hs.receive_frame(frame.type, frame.data):
                if isinstance(action, Upgrade):
                    self._upgrade(action)
                    if self._tls_wants is not None:
                        return  # nothing else comes before the TLS handshake is done
                else:
                    self._hs_send(action)
        self._handshake_done()

    def _upgrade(self, up: Upgrade) -> None:
        if up.kind == "tls":
            self._stream.peer_version = self._hs.negotiated.version  # named in a TLS failure (transport)
            self._stream.start_tls(self.config.tls)
            self._tls_wants = "start"
            self._tls_step()
            return
        leftover = self._decoder.take_buffered()  # after the reply: already compressed bytes
        self._stream.upgrade_compression(up.kind, up.level)
        self._decoder.receive_data(self._stream.decompress(leftover))

    def _tls_step(self) -> None:
        want = self._stream.tls_step()
        self._tls_wants = want
        if want is None:
            self._set_events()
            if self._stream.pending():
                self._loop.again.add(self)
            return
        self._set_events(selectors.EVENT_READ if want == "read" else selectors.EVENT_WRITE)

    def _handshake_done(self) -> None:
        if self._aborted is not None:  # abort() or close() came while the last reply was read
            raise self._aborted
        hs = self._hs
        n = hs.negotiated
        self.negotiated = n
        self.features = n.features
        self.max_rdy_count = n.max_rdy_count
        self.msg_timeout = n.msg_timeout
        limits.note_identify(self.address, n)
        self.auth_info = hs.auth_info
        self._hs = None
        # other threads may send directly on a plain socket only: one SSL object must not read
        # in one thread while writing in another, and a compressed stream cannot hand a
        # half-sent compressed remainder back to the queue
        self._direct = self._stream.plain
        if self.config.auth_secret and not n.auth_required and self.config.on_notice is not None:
            self.config.on_notice(f"nsqd {self.address} does not use AUTH: the --auth-secret was not sent "
                                  "(is this the cluster you meant?)")
        self.last_read = time.monotonic()
        self.connected_at = time.time()
        with self._wlock:
            self.state = CONNECTED
            self._phase = IO
        self._ready.set()
        self._tell_connected(None)
        # frames read with the handshake's reply came before anything queued was written:
        # they cannot answer it
        self._dispatch_buffered(self.delegate)
        if self._decoder.error is not None:
            raise self._decoder.error
        self._flush()

    def _handshake_failed(self, e: BaseException) -> None:
        if isinstance(e, RemoteProtocolError):
            e = self._located(e)
        identify = self._hs_args[0] if self._hs_args else {}
        refused = refused_identify_field(e) if isinstance(e, ServerError) else None
        again = False
        if (refused == "output_buffer_size" and self.config.output_buffer_size is None
                and "output_buffer_size" in identify):
            # the 64 KiB buffer Config asks for on its own (see Config.output_buffer_size) is
            # above this nsqd's --max-output-buffer-size: again, with nsqd's default
            del identify["output_buffer_size"]
            again = True
        elif refused == "output_buffer_timeout" and identify.get("output_buffer_timeout", 0) != 0:
            # outside this nsqd's [--min-output-buffer-timeout, --max-output-buffer-timeout]
            # (nsqd >= 1.2 refuses below its minimum, 25 ms by default): again, once, with
            # nsqd's own default (0); later connections to it do so at once, and fit into its
            # range when its /config has told it (nsqcli.client.limits, asked in the background)
            identify["output_buffer_timeout"] = 0
            limits.refused(self.address, refused)
            again = True
        if again:
            try:
                self._forget_socket()
                self._decoder = FrameDecoder(self.config.max_frame_size)
                self._out, self._off = b"", 0
                self._hs = Handshake(*self._hs_args)
                if self._end <= time.monotonic():
                    raise Timeout("no answer to IDENTIFY in time", self.address)
                self._dial_now()
                self._attach()
                return
            except BaseException as again:
                e = again
        self._forget_socket()
        with self._wlock:
            self.state = CLOSED
            self._phase = DONE
        self._ready_error = e
        loop_pool.release(self._loop)
        self._ready.set()
        self.closed_event.set()
        self._tell_connected(e)

    def _tell_connected(self, error: BaseException | None) -> None:
        """The owner hears how the attempt ended (on the loop: a callback that raises is
        logged, and the loop goes on)."""
        if self._on_connected is None:
            return
        try:
            self._on_connected(self, error)
        except Exception as e:
            _log().error("%s: the on_connected callback failed: %s: %s", self.address, type(e).__name__, e)
            _log().debug("traceback", exc_info=True)
