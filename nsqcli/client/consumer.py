"""Consumer: subscribe to one topic/channel on many nsqd, found directly and/or through
nsqlookupd, with RDY distribution and backoff (nsqcli.client.flow) and handler threads.

Threads: one I/O thread per connection (nsqcli.client.conn), ``concurrency`` handler threads fed with
per-recv batches through a SimpleQueue (the I/O thread never blocks on handlers, so heartbeats
are always answered), and one control thread for timers: RDY redistribution, backoff expiry,
lookupd polls, reconnects. Errors in any thread go to ``on_error``; nothing vanishes silently.

    c = Consumer("topic", "channel", handler, lookupd_http_addresses=["127.0.0.1:4161"],
                 config=Config(max_in_flight=200))
    c.start(); ...; c.stop()

Handlers: ``handler(message)`` per message (auto FIN on return, REQ with backoff on exception,
unless the handler responded or called ``message.disable_auto_response()``), or
``batch_handler(messages)`` for commands that write and sync a batch before FINing it.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable

from .config import Config
from .conn import CLOSED, Connection, ConnStats
from ..errors import NSQError, ServerError, TransportError
from .flow import Flow
from .http import lookup_all
from ..protocol import encode_rdy, encode_req, encode_touch, validate_channel, validate_topic

log = logging.getLogger("nsqcli.client.consumer")

#: seconds between cutting RDY on some connections and raising it on others
RDY_SETTLE = 0.05


def _fins(ids: list[bytes]) -> bytes:
    """Many FIN commands in one buffer (hot path: ids come from nsqd, always 16 bytes)."""
    return b"".join([b"FIN " + i + b"\n" for i in ids])


class _Handle:
    """The responder attached to each message: routes FIN/REQ/TOUCH to its connection."""

    __slots__ = ("conn", "consumer", "address", "topic", "channel")

    def __init__(self, conn: Connection, consumer: "Consumer"):
        self.conn = conn
        self.consumer = consumer
        self.address = conn.address
        self.topic = consumer.topic
        self.channel = consumer.channel

    def finish(self, msg) -> None:
        self.consumer._respond(self, b"FIN " + msg.id + b"\n", 1, "fin")

    def requeue(self, msg, delay: float | None, backoff: bool) -> None:
        cfg = self.consumer.config
        if delay is None:
            delay = min(msg.attempts * cfg.default_requeue_delay, cfg.max_requeue_delay)
        kind = "req_backoff" if backoff else "req"
        self.consumer._respond(self, encode_req(msg.id, max(0, int(delay * 1000))), 1, kind)

    def touch(self, msg) -> None:
        try:
            self.conn.write(encode_touch(msg.id))
        except TransportError:
            pass


class Consumer:
    def __init__(self, topic: str, channel: str, handler: Callable | None = None, *,
                 config: Config | None = None, batch_handler: Callable | None = None,
                 nsqd_tcp_addresses: list[str] | tuple = (), lookupd_http_addresses: list[str] | tuple = (),
                 on_give_up: Callable | None = None, on_error: Callable | None = None,
                 rng: random.Random | None = None):
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        if (handler is None) == (batch_handler is None):
            raise ValueError("give exactly one of handler or batch_handler")
        if not nsqd_tcp_addresses and not lookupd_http_addresses:
            raise ValueError("give nsqd_tcp_addresses and/or lookupd_http_addresses")
        self.handler = handler
        self.batch_handler = batch_handler
        self.config = cfg = config or Config()
        self.nsqd_addresses = list(dict.fromkeys(nsqd_tcp_addresses))
        self.lookupd_addresses = list(lookupd_http_addresses)
        self.on_give_up = on_give_up
        self.on_error = on_error or (lambda err: log.warning("%s", err))
        self.rng = rng or random.Random()
        self.flow = Flow(cfg.max_in_flight, backoff_multiplier=cfg.backoff_multiplier,
                         max_backoff_duration=cfg.max_backoff_duration,
                         backoff_strategy=cfg.backoff_strategy,
                         low_rdy_idle_timeout=cfg.low_rdy_idle_timeout,
                         low_rdy_timeout=cfg.low_rdy_timeout,
                         redistribute_interval=cfg.rdy_redistribute_interval, rng=self.rng)
        self._lock = threading.RLock()
        self._handles: dict[str, _Handle] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._control: threading.Thread | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._stopped = threading.Event()
        self._reconnect: dict[str, tuple[int, float]] = {}  # address -> (failures, next try)
        self._pending_up: dict[Connection, tuple[int, float]] = {}  # delayed RDY raises
        self._next_poll = 0.0
        self.given_up = 0
        self.lost_responses = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, fail_fast: bool = True) -> "Consumer":
        """Connect to the direct nsqd addresses and query every lookupd once, then run.

        With ``fail_fast`` and no connection at all, the first error is raised (a CLI wants
        "connection refused", not silence); otherwise everything is retried in the background."""
        errors: list[NSQError] = []
        for address in self.nsqd_addresses:
            err = self._try_connect(address, direct=True, report=False)
            if err:
                errors.append(err)
        if self.lookupd_addresses:
            errors += self._poll_lookupd(report=False)
        if fail_fast and not self._handles and errors and not (
                self.lookupd_addresses and len(errors) < len(self.lookupd_addresses)):
            self._shutdown_threads()
            raise errors[0]
        for err in errors:
            self.on_error(err)
        for i in range(max(1, self.config.concurrency)):
            t = threading.Thread(target=self._worker, name=f"nsqcli-handler-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        self._control = threading.Thread(target=self._control_loop, name="nsqcli-control", daemon=True)
        self._control.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """CLS everywhere, let handlers finish what they hold (bounded), close, join threads."""
        if self._stopping:
            self._stopped.wait(timeout)
            return
        self._stopping = True
        deadline = time.monotonic() + timeout
        handles = self._close_wait(deadline)
        self._wait_settled(deadline)
        # nsqd may still send a message it had in hand when CLS arrived: give it a moment,
        # so that it is handled and answered instead of left to time out
        for _ in range(5):
            received = sum(h.conn.received for h in handles)
            time.sleep(0.02)
            if sum(h.conn.received for h in handles) == received:
                break
            self._wait_settled(deadline)
        for h in handles:
            h.conn.close(max(0.1, deadline - time.monotonic()))
        self._shutdown_threads()
        self._stopped.set()

    def drain(self, timeout: float = 30.0) -> None:
        """CLS everywhere, wait for CLOSE_WAIT, then until the handlers have taken every message
        received so far. Afterwards no new message arrives; what handlers hold is theirs to
        FIN/REQ (to-file syncs it) before stop()."""
        deadline = time.monotonic() + timeout
        self._close_wait(deadline)
        if self._workers:
            marker = threading.Event()
            self._queue.put(marker)
            marker.wait(max(0.0, deadline - time.monotonic()))

    def _close_wait(self, deadline: float) -> list[_Handle]:
        """CLS to every connection, then wait (bounded) for each CLOSE_WAIT."""
        with self._lock:
            handles = list(self._handles.values())
        for h in handles:
            try:
                h.conn.send_cls()
            except TransportError:
                pass
        for h in handles:
            h.conn.close_wait_event.wait(max(0.0, min(5.0, deadline - time.monotonic())))
        return handles

    def _wait_settled(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with self._lock:
                busy = sum(c.in_flight for c in self.flow.conns.values())
            if busy == 0 and self._queue.empty():
                return
            time.sleep(0.01)

    def _shutdown_threads(self) -> None:
        self._stopping = True
        for _ in self._workers:
            self._queue.put(None)
        for t in self._workers:
            if t is not threading.current_thread():
                t.join(5)
        self._wake.set()
        if self._control and self._control is not threading.current_thread():
            self._control.join(5)

    def join(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def __enter__(self) -> "Consumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- state -----------------------------------------------------------------------------------
    def is_starved(self) -> bool:
        with self._lock:
            return self.flow.is_starved()

    def set_max_in_flight(self, n: int) -> None:
        with self._lock:
            self._send_rdy(self.flow.set_max_in_flight(n, time.monotonic()))

    @property
    def connections(self) -> list[str]:
        return list(self._handles)

    def stats(self) -> list[ConnStats]:
        """One snapshot per live connection (for live tables)."""
        now = time.monotonic()
        with self._lock:
            state = self.flow.backoff_state(now)
            out = []
            for h in self._handles.values():
                f = self.flow.conns.get(h.conn)
                out.append(h.conn.snapshot(state, f.in_flight if f is not None else 0))
            return out

    # -- connections -------------------------------------------------------------------------
    def _try_connect(self, address: str, direct: bool, report: bool = True) -> NSQError | None:
        if self._stopping or address in self._handles:
            return None
        conn = Connection(address, self.config, self, name=self.channel)
        try:
            conn.connect(subscribe=(self.topic, self.channel))
        except (NSQError, ValueError) as e:
            err = e if isinstance(e, NSQError) else TransportError(str(e), address)
            if direct:
                self._schedule_reconnect(address)
            if report:
                self.on_error(err)
            return err
        max_rdy = conn.max_rdy_count
        if max_rdy < self.config.max_in_flight:
            log.info("%s: max_rdy_count %d is below max_in_flight %d", address, max_rdy,
                     self.config.max_in_flight)
        handle = _Handle(conn, self)
        conn.responder = handle
        with self._lock:
            self._handles[address] = handle
            self._reconnect.pop(address, None)
            self._send_rdy(self.flow.add(conn, max_rdy, time.monotonic()))
        if self._stopping:
            conn.send_cls()
        return None

    def _schedule_reconnect(self, address: str) -> None:
        failures, _ = self._reconnect.get(address, (0, 0.0))
        cfg = self.config
        delay = min(cfg.reconnect_max_delay, cfg.reconnect_min_delay * 2 ** failures)
        delay *= 0.5 + self.rng.random() * 0.5  # jitter: 50-100 %
        self._reconnect[address] = (failures + 1, time.monotonic() + delay)
        self._wake.set()

    def _send_rdy(self, changes: list) -> None:
        """Write RDY changes (called with the lock held).

        Decreases go out at once. When the same change set also raises RDY elsewhere, the
        raises wait RDY_SETTLE seconds: each connection has its own I/O thread, so without the
        pause a raise on one nsqd could land before the matching cut on another and the total
        ready count seen by the nsqds would briefly exceed max_in_flight."""
        if not changes:
            return
        now = time.monotonic()
        has_down = any(n < conn.rdy_sent for conn, n in changes)
        for conn, n in changes:
            if n < conn.rdy_sent or not has_down:
                self._pending_up.pop(conn, None)
                self._write_rdy(conn, n)
            else:
                self._pending_up[conn] = (n, now + RDY_SETTLE)
        if self._pending_up:
            self._wake.set()

    def _write_rdy(self, conn: Connection, n: int) -> None:
        conn.rdy = conn.rdy_sent = n
        try:
            conn.write(encode_rdy(min(n, conn.max_rdy_count)))
        except TransportError:
            pass

    def _flush_pending_rdy(self, now: float) -> float:
        """Send the delayed raises that are due; returns seconds until the next one."""
        wait = 1.0
        for conn, (n, when) in list(self._pending_up.items()):
            if now >= when:
                del self._pending_up[conn]
                if conn.state != CLOSED:
                    self._write_rdy(conn, n)
            else:
                wait = min(wait, when - now)
        return wait

    # -- delegate callbacks (connection I/O threads) ----------------------------------------
    def on_messages(self, conn: Connection, msgs: list) -> None:
        handle = conn.responder  # already attached to each message by the decoder
        if handle is None:
            return
        with self._lock:
            changes = self.flow.received(conn, len(msgs), time.monotonic())
            if changes:
                self._send_rdy(changes)
        self._queue.put((handle, msgs))

    def on_response(self, conn: Connection, data: bytes) -> None:
        pass  # OK to SUB is read during connect; CLOSE_WAIT sets conn.close_wait_event

    def on_error(self, conn: Connection, err: ServerError) -> None:
        if err.code == "E_FIN_FAILED" or err.code == "E_REQ_FAILED" or err.code == "E_TOUCH_FAILED":
            conn.timed_out += 1  # the message timed out on nsqd before our answer
        self.on_error(err)

    def on_close(self, conn: Connection, error: BaseException | None) -> None:
        with self._lock:
            handle = self._handles.get(conn.address)
            if handle is not None and handle.conn is conn:
                del self._handles[conn.address]
                self._pending_up.pop(conn, None)
                f = self.flow.conns.get(conn)
                if f is not None:
                    self.lost_responses += f.in_flight
                self._send_rdy(self.flow.remove(conn, time.monotonic()))
        if self._stopping:
            return
        if error is not None:
            self.on_error(error if isinstance(error, NSQError) else TransportError(str(error), conn.address))
        if conn.address in self.nsqd_addresses:
            self._schedule_reconnect(conn.address)
        if self.lookupd_addresses:
            self._next_poll = 0.0  # re-query at once
            self._wake.set()

    # -- responses (any thread) --------------------------------------------------------------
    def _respond(self, handle: _Handle, command: bytes, n: int, kind: str) -> None:
        conn = handle.conn
        if conn.state != CLOSED:
            try:
                conn.write(command)
            except TransportError:
                pass
        self._settle(handle, n, kind)

    def _settle(self, handle: _Handle, n: int, kind: str) -> None:
        conn = handle.conn
        with self._lock:
            flow = self.flow
            flow.settled(conn, n)
            if kind == "fin":
                conn.finished += n
                if flow.in_backoff:
                    self._send_rdy(flow.success(time.monotonic()))
            else:
                conn.requeued += n
                now = time.monotonic()
                self._send_rdy(flow.failure(now) if kind == "req_backoff" else flow.neutral(now))
        if flow.backoff_until is not None:
            self._wake.set()

    def finish_many(self, msgs: list) -> None:
        """FIN many messages with one write per connection (used by batch handlers)."""
        by_handle: dict[_Handle, list] = {}
        for m in msgs:
            if not m.responded:
                m.responded = True
                by_handle.setdefault(m.responder, []).append(m.id)
        for handle, ids in by_handle.items():
            self._respond(handle, _fins(ids), len(ids), "fin")

    # -- handler threads ---------------------------------------------------------------------
    def _worker(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                if self._stopping:
                    return
                continue
            if isinstance(item, threading.Event):  # drain() marker
                item.set()
                continue
            handle, msgs = item
            try:
                if self.batch_handler is not None:
                    self._run_batch(handle, msgs)
                else:
                    self._run_each(handle, msgs)
            except BaseException as e:  # never let a handler thread die silently
                self.on_error(e)

    def _give_up(self, msg) -> None:
        self.given_up += 1
        if self.on_give_up is not None:
            self.on_give_up(msg)
        else:
            log.warning("giving up on message %s after %d attempts", msg.id.decode(errors="replace"),
                        msg.attempts)

    def _run_each(self, handle: _Handle, msgs: list) -> None:
        handler, max_attempts = self.handler, self.config.max_attempts
        fins = []
        for m in msgs:
            if max_attempts and m.attempts > max_attempts:
                self._give_up(m)
                if not m.responded:
                    m.responded = True
                    fins.append(m.id)
                continue
            try:
                handler(m)
            except Exception as e:
                self.on_error(e)
                if not m.responded and m.auto_response:
                    m.requeue()
                continue
            if not m.responded and m.auto_response:
                m.responded = True
                fins.append(m.id)
        if fins:
            self._respond(handle, _fins(fins), len(fins), "fin")

    def _run_batch(self, handle: _Handle, msgs: list) -> None:
        max_attempts = self.config.max_attempts
        if max_attempts:
            keep = []
            for m in msgs:
                if m.attempts > max_attempts:
                    self._give_up(m)
                    if not m.responded:
                        m.finish()
                else:
                    keep.append(m)
            msgs = keep
        if not msgs:
            return
        try:
            self.batch_handler(msgs)
        except Exception as e:
            self.on_error(e)
            for m in msgs:
                if not m.responded and m.auto_response:
                    m.requeue()
            return
        ids = []
        for m in msgs:  # one recv batch = one connection: FIN them in one write
            if m.auto_response and not m.responded:
                m.responded = True
                ids.append(m.id)
        if ids:
            self._respond(handle, _fins(ids), len(ids), "fin")

    # -- the control thread -----------------------------------------------------------------------
    def _control_loop(self) -> None:
        while not self._stopping:
            try:
                self._control_step()
            except Exception as e:  # report, keep going
                self.on_error(e)
            self._wake.wait(self._control_timeout())
            self._wake.clear()

    def _control_timeout(self) -> float:
        now = time.monotonic()
        with self._lock:
            t = min(self.flow.next_wakeup(now), self._flush_pending_rdy(now))
        if self.lookupd_addresses:
            t = min(t, max(0.0, self._next_poll - now))
        for _, when in list(self._reconnect.values()):
            t = min(t, max(0.0, when - now))
        return max(0.005, min(t, 1.0))

    def _control_step(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._send_rdy(self.flow.tick(now))
            self._flush_pending_rdy(now)
        for address, (_, when) in list(self._reconnect.items()):
            if now >= when and not self._stopping:
                self._try_connect(address, direct=True)
        if self.lookupd_addresses and now >= self._next_poll and not self._stopping:
            self._poll_lookupd(report=True)

    def _poll_lookupd(self, report: bool) -> list[NSQError]:
        cfg = self.config
        jitter = 1 + cfg.lookupd_poll_jitter * (self.rng.random() - 0.5)
        self._next_poll = time.monotonic() + cfg.lookupd_poll_interval * jitter
        producers, errors = lookup_all(self.lookupd_addresses, self.topic, cfg.lookupd_poll_timeout)
        if report:
            for e in errors:
                self.on_error(e)
        for p in producers:
            if p.tcp_address not in self._handles and p.tcp_address not in self._reconnect:
                err = self._try_connect(p.tcp_address, direct=p.tcp_address in self.nsqd_addresses,
                                        report=report)
                if err is not None and not report:
                    errors.append(err)
        return list(errors)
