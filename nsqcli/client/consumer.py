"""Consumer: subscribe to one topic/channel on many nsqd, found directly and/or through
nsqlookupd, with RDY distribution and backoff (nsqcli.client.flow) and handler threads.

Threads: none of its own per connection. Connections run on the process's I/O loops
(nsqcli.client.loop: dial, handshake, reads, heartbeats answered at once); recv batches go to
handler threads (a HandlerPool of ``concurrency`` threads, the consumer's own or one shared by
many consumers; for a per-message handler each batch is cut into up to ``concurrency``
chunks so the threads share it); timers (RDY redistribution, backoff expiry, TOUCH of held
messages) and discovery's due reconnects run on the shared timer thread, lookupd polls on a
shared blocking-call thread (nsqcli.client.workers). Connection attempts all run at once,
each under its own deadline. Errors in any thread go to ``on_error``; nothing vanishes
silently.

    c = Consumer("topic", "channel", handler, lookupd_http_addresses=["127.0.0.1:4161"],
                 config=Config(max_in_flight=200))
    c.start(); ...; c.stop()

Handlers: ``handler(message)`` per message (auto FIN on return, REQ with backoff on exception,
unless the handler responded or called ``message.disable_auto_response()``), or
``batch_handler(messages)`` for commands that write and sync a batch before FINing it
(nsqcli.client.handlers); or ``pull=True``: held batches taken with poll() (nsqcli.client.pull).

The Consumer itself keeps the lifecycle and the connection registry, and composes its parts,
each given what it needs at construction: the handler mode, Responses (FIN/REQ/TOUCH writes,
nsqcli.client.responses), RdyWriter (RDY on the wire, delayed raises: nsqcli.client.rdy),
Discovery (lookupd polls and reconnects: nsqcli.client.discovery). Each connection has a Link
(nsqcli.client.links: the consumer's counts for it, every message's responder); its events
come through the private adapter _ConnEvents.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections.abc import Callable

from .config import Config
from .conn import Connection, ConnectionDelegate
from ..errors import ConnectError, NSQError, ServerError, TransportError
from .flow import Flow
from . import fdlimit, workers
from . import loop as loop_pool
from .discovery import Discovery
from .handlers import Handlers
from .links import ConnStats, Link
from .loop import SWEEP
from .pull import Pull
from .rdy import RdyWriter
from .responses import Responses
from .workers import HandlerPool
from ..protocol import validate_channel, validate_topic

log = logging.getLogger("nsqcli.client.consumer")

#: seconds start() waits for the other attempts once one connection is up
START_GRACE = 0.5
#: check, at every RDY written, that the RDY of all connections adds up to no more than
#: max_in_flight; a breach is noted in RDY_BREACHES (the tests turn it on and fail a test that
#: leaves one: tests/conftest.py)
CHECK_RDY_TOTAL = False
RDY_BREACHES: list[str] = []


class _ConnEvents(ConnectionDelegate):
    """What its connections tell a consumer (go-nsq's consumerConnDelegate): the
    ConnectionDelegate interface, forwarded to the consumer. On the I/O loop: never blocks."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: "Consumer"):
        self._consumer = consumer

    def on_messages(self, conn: Connection, msgs: list, nbytes: int) -> None:
        self._consumer._on_messages(conn, msgs, nbytes)

    def on_response(self, conn: Connection, data: bytes) -> None:
        pass  # OK to SUB is read during connect; CLOSE_WAIT sets conn.close_wait_event

    def on_server_error(self, conn: Connection, err: ServerError) -> None:
        self._consumer._on_server_error(conn, err)

    def on_close(self, conn: Connection, error: BaseException | None) -> None:
        self._consumer._on_close(conn, error)


class Consumer:
    """Subscribe ``topic``/``channel``. Give exactly one of ``handler`` (per message),
    ``batch_handler`` (per recv batch) or ``pull=True`` (held batches: take messages with
    :meth:`poll`, answer them with :meth:`finish_many` / :meth:`requeue_many` /
    :meth:`touch_many` from any thread; nothing is answered automatically)."""

    def __init__(self, topic: str, channel: str, handler: Callable | None = None, *,
                 config: Config | None = None, batch_handler: Callable | None = None,
                 pull: bool = False,
                 nsqd_tcp_addresses: list[str] | tuple = (), lookupd_http_addresses: list[str] | tuple = (),
                 on_give_up: Callable | None = None, on_error: Callable | None = None,
                 rng: random.Random | None = None, dial=None, handlers: HandlerPool | None = None):
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        if (handler is not None) + (batch_handler is not None) + bool(pull) != 1:
            raise ValueError("give exactly one of handler, batch_handler or pull=True")
        if not nsqd_tcp_addresses and not lookupd_http_addresses:
            raise ValueError("give nsqd_tcp_addresses and/or lookupd_http_addresses")
        self.handler = handler
        self.batch_handler = batch_handler
        self.pull = bool(pull)
        self.config = cfg = config or Config()
        self.nsqd_addresses = list(dict.fromkeys(nsqd_tcp_addresses))
        self.lookupd_addresses = list(lookupd_http_addresses)
        # the user's error callback (one argument); NOT the connection delegate's on_server_error
        self._on_error = on_error or (lambda err: log.warning("%s", err))
        self.rng = rng or random.Random()
        self._dial = dial
        self.flow = Flow(cfg.max_in_flight, backoff_multiplier=cfg.backoff_multiplier,
                         max_backoff_duration=cfg.max_backoff_duration, backoff_strategy=cfg.backoff_strategy,
                         low_rdy_idle_timeout=cfg.low_rdy_idle_timeout, low_rdy_timeout=cfg.low_rdy_timeout,
                         redistribute_interval=cfg.rdy_redistribute_interval,
                         max_in_flight_bytes=cfg.max_in_flight_bytes, rng=self.rng)
        self._lock = threading.RLock()
        self._links: dict[str, Link] = {}  # address -> the connection, once connected
        self._connecting: dict[str, Connection] = {}   # address -> attempt in progress
        self._attempts: dict[Connection, tuple[bool, bool]] = {}  # -> (direct, report)
        self._settling = threading.Condition(self._lock)  # an attempt ended
        self._start_errors: list | None = None  # start() collects the attempts' errors
        self._timer_on = False
        self._stopping = False     # no new connections (drain() or stop() began)
        self._stop_called = False
        self._stopped = threading.Event()
        self._rdy = RdyWriter(self.flow, self._links, wake=lambda: self._wake(), check=lambda: CHECK_RDY_TOTAL,
                              breaches=RDY_BREACHES)  # RDY on the wire, delayed raises
        self.lost_responses = 0   # FIN/REQ/TOUCH that could not be delivered: nsqd redelivers
        self._late_closed = 0     # late_messages / timed_out of connections already closed
        self._timed_out_closed = 0
        self._closed_counts = [0, 0, 0]  # received, finished, requeued of closed connections
        self._compose(handler, batch_handler, handlers, on_give_up)

    def _compose(self, handler, batch_handler, handlers: HandlerPool | None, on_give_up) -> None:
        """The parts, each given what it needs (callbacks are looked up at call time: tests
        replace _report). Pull mode holds batches for poll(); the handler modes run them on a
        pool of handler threads (this consumer's own, or one shared by many consumers)."""
        cfg, lock = self.config, self._lock
        self._pull: Pull | None = None
        self._handlers: Handlers | None = None
        if self.pull:
            self._pull = Pull(cfg, lock=lock, touch=lambda msgs: self.touch_many(msgs),
                              msg_timeouts=lambda: self.msg_timeouts())
        # FIN/REQ/TOUCH, settled here (flow control, counts)
        self._responses = Responses(cfg, lock=lock, settle=lambda *a: self._settle(*a), pull=self._pull)
        if not self.pull:
            self._handlers = Handlers(handler, batch_handler, cfg, handlers, lock=lock,
                                      respond=self._responses.respond, report=lambda e: self._report(e),
                                      on_give_up=on_give_up)
        self._mode = self._pull or self._handlers
        self._events = _ConnEvents(self)  # the delegate of every connection
        # lookupd polls and (re)connects, on the shared timer thread
        self.discovery = Discovery(self.topic, self.lookupd_addresses, self.nsqd_addresses, cfg, lock=lock,
                                   rng=self.rng, connect=lambda *a, **k: self._try_connect(*a, **k),
                                   connected=self._links.keys, stopping=lambda: self._stopping,
                                   report=lambda e: self._report(e))

    def _report(self, err: BaseException) -> None:
        """Tell the user's on_error - from any thread, the I/O loop included: a callback that
        raises is logged, never allowed to take the thread down with it."""
        try:
            self._on_error(err)
        except Exception as e:
            log.error("the on_error callback failed (%s: %s) on: %s", type(e).__name__, e, err)
            log.debug("traceback", exc_info=True)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, fail_fast: bool = True, deadline: float | None = None, found=()) -> "Consumer":
        """Connect to the direct nsqd addresses and query every lookupd once, then run.

        Every connection is attempted at once. With ``fail_fast`` this returns when all
        attempts ended, or ``START_GRACE`` seconds after the first one succeeded (a hung nsqd
        does not hold up the healthy ones: its attempt goes on, bounded by its own deadline, in
        the background), and with no connection at all the first error is raised (a CLI wants
        "connection refused", not silence). Without it, this returns at once: the lookupds are
        asked in the background, errors are reported, and everything is retried.
        ``deadline`` (time.monotonic()) bounds this call: handshakes and lookups included.
        ``found``: nsqd TCP addresses a lookup just returned for this topic (to-file's topic
        refresh): connected at once, and the lookupds asked again at the regular interval."""
        errors: list[NSQError] = []
        if fail_fast:
            self._start_errors = []
        # the handlers run before the first connection: a start cut short (a signal raised in
        # the caller's thread) leaves nothing received without a handler, and stop() drains it
        if self._handlers is not None:
            self._handlers.start()
        for address in self.nsqd_addresses:
            self._try_connect(address, direct=True, report=not fail_fast, deadline=deadline)
        for address in found:
            self._try_connect(address, direct=address in self.nsqd_addresses, report=not fail_fast,
                              deadline=deadline)
        if found and self.lookupd_addresses:
            self.discovery.plan_next_poll()
        if fail_fast:
            if self.lookupd_addresses and not found:
                errors += self.discovery.poll_lookupd(report=False, deadline=deadline)
            self._wait_connecting(deadline)
        # else: nothing to wait for - the first lookupd poll runs at once in the background
        with self._lock:
            errors += self._start_errors or []
            self._start_errors = None
        if fail_fast and not self._links and errors and not self._connecting and not (
                self.lookupd_addresses and len(errors) < len(self.lookupd_addresses)):
            self._shutdown_threads()
            raise errors[0]
        for err in errors if not self._stopping else ():  # (interrupted: nothing to say)
            if not fdlimit.out_of_descriptors(err):  # said once already
                self._report(err)
        workers.TIMERS.add(self, self._timer_step)
        self._timer_on = True
        self.discovery.start()
        return self

    def _wait_connecting(self, deadline: float | None) -> None:
        """Until no attempt is in progress, or START_GRACE after the first connection (or just
        past ``deadline``: the attempts' own deadline checks come within a loop sweep)."""
        end = None if deadline is None else deadline + 3 * SWEEP
        graced = False
        with self._lock:
            while self._connecting:
                now = time.monotonic()
                if self._links and not graced:
                    graced = True
                    end = now + START_GRACE if end is None else min(end, now + START_GRACE)
                if end is not None and now >= end:
                    return
                self._settling.wait(None if end is None else end - now)

    def stop(self, timeout: float = 30.0) -> None:
        """CLS everywhere, let handlers finish what they hold (bounded), close, join threads."""
        if self._stop_called:
            self._stopped.wait(timeout)
            return
        self._stop_called = self._stopping = True
        self._abort_connecting()
        deadline = time.monotonic() + timeout
        links = self._close_wait(deadline)
        self._wait_settled(deadline)
        # nsqd may still send a message it had in hand when CLS arrived: give it a moment,
        # so that it is handled and answered instead of left to time out
        for _ in range(5):
            received = sum(link.received for link in links)
            time.sleep(0.02)
            if sum(link.received for link in links) == received:
                break
            self._wait_settled(deadline)
        self._shutdown_threads()
        with self._lock:  # a connection the discovery thread finished meanwhile is closed too
            links = list({id(link): link for link in links + list(self._links.values())}.values())
        end = max(time.monotonic() + 0.1, deadline)
        for link in links:  # every connection closes at once; one deadline for all of them
            link.conn.close(end - time.monotonic(), wait=False)
        for link in links:
            link.conn.closed_event.wait(max(0.0, end - time.monotonic()) + 0.5)
        self._stopped.set()

    def drain(self, timeout: float = 30.0) -> None:
        """CLS everywhere, wait for CLOSE_WAIT, then until the handlers have taken every message
        received so far. Afterwards no new message arrives; what handlers hold is theirs to
        FIN/REQ (to-file syncs it) before stop()."""
        deadline = time.monotonic() + timeout
        self._stopping = True  # no new connections from here on
        self._abort_connecting()
        self._close_wait(deadline)
        if self._handlers is not None:
            self._handlers.wait_idle(deadline)

    def interrupt(self) -> None:
        """(any thread) A signal cut the start short: no new connection from here on, and the
        handshakes in progress fail at once (start() then returns; stop() or drain() follows)."""
        self._stopping = True
        self._abort_connecting()

    def _abort_connecting(self) -> None:
        """Unblock handshakes in progress on other threads (they then fail at once)."""
        with self._lock:
            connecting = list(self._connecting.values())
        for conn in connecting:
            conn.abort()

    def _close_wait(self, deadline: float) -> list[Link]:
        """CLS to every connection, then wait (bounded) for each CLOSE_WAIT."""
        with self._lock:
            links = list(self._links.values())
        for link in links:
            try:
                link.conn.send_cls()
            except TransportError:
                pass
        end = min(deadline, time.monotonic() + 5.0)  # one wait for every node, not one each
        for link in links:
            link.conn.close_wait_event.wait(max(0.0, end - time.monotonic()))
        return links

    def _wait_settled(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.pull:  # held messages are the caller's: they are requeued at close by nsqd
                return
            with self._lock:
                busy = sum(c.in_flight for c in self.flow.conns.values())
            if busy == 0 and self._handlers.outstanding == 0:
                return
            time.sleep(0.01)

    def _shutdown_threads(self) -> None:
        self._stopping = True
        if self._handlers is not None:
            self._handlers.stop()
        if self._timer_on:
            self._timer_on = False
            workers.TIMERS.remove(self)
        self.discovery.join(5)

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
            self._rdy.send(self.flow.set_max_in_flight(n, time.monotonic()))

    def msg_timeouts(self) -> list[float]:
        """The msg_timeout (seconds) nsqd granted each live connection in IDENTIFY."""
        with self._lock:
            return [h.conn.negotiated.msg_timeout for h in self._links.values()
                    if h.conn.negotiated is not None and h.conn.negotiated.msg_timeout]

    @property
    def on_give_up(self) -> Callable | None:
        return None if self._handlers is None else self._handlers.on_give_up

    @property
    def given_up(self) -> int:
        """Messages over max_attempts, FINed without being handled."""
        return 0 if self._handlers is None else self._handlers.given_up

    @property
    def connections(self) -> list[str]:
        return list(self._links)

    @property
    def late_messages(self) -> int:
        """Messages that arrived after CLS and could not be answered (nsqd redelivers them)."""
        with self._lock:
            return self._late_closed + sum(h.conn.late_messages for h in self._links.values())

    def stats(self) -> list[ConnStats]:
        """One snapshot per live connection (for live tables)."""
        now = time.monotonic()
        with self._lock:
            state = self.flow.backoff_state(now)
            out = []
            for h in self._links.values():
                f = self.flow.conns.get(h)
                out.append(h.snapshot(state, f.in_flight if f is not None else 0))
            return out

    def totals(self) -> dict:
        """Counts over the consumer's life, for JSON status and summaries."""
        with self._lock:
            conns = list(self._links.values())
            received, finished, requeued = self._closed_counts
            return {"connections": len(conns), "given_up": self.given_up,
                    "lost_responses": self.lost_responses, "late_messages": self.late_messages,
                    "timed_out": self._timed_out_closed + sum(c.timed_out for c in conns),
                    "received": received + sum(c.received for c in conns),
                    "finished": finished + sum(c.finished for c in conns),
                    "requeued": requeued + sum(c.requeued for c in conns)}

    # -- connections (the caller of start(), then the discovery thread) -----------------------
    def _try_connect(self, address: str, direct: bool, report: bool = True,
                     deadline: float | None = None) -> NSQError | None:
        """Start connecting to ``address`` (dial and handshake on an I/O loop, in parallel with
        every other attempt). Returns an error only when the attempt could not even start."""
        if not fdlimit.room_for_connection(loop_pool.connections()):
            err = ConnectError("cannot connect: out of file descriptors", address)
            err.errno = errno.EMFILE
            self._connect_failed(address, err, direct, report)
            return err
        with self._lock:
            if self._stopping or address in self._links or address in self._connecting:
                return None
            conn = Connection(address, self.config, self._events, name=self.channel, dial=self._dial)
            conn.responder = Link(conn, self.topic, self.channel, self._responses)
            self._connecting[address] = conn
            self._attempts[conn] = (direct, report)
        try:
            conn.begin(subscribe=(self.topic, self.channel), deadline=deadline,
                       on_connected=self._connected)
        except (NSQError, ValueError) as e:
            with self._lock:
                self._connecting.pop(address, None)
                self._attempts.pop(conn, None)
            err = e if isinstance(e, NSQError) else TransportError(str(e), address)
            self._connect_failed(address, err, direct, report)
            return err
        return None

    def _connected(self, conn: Connection, error: BaseException | None) -> None:
        """(I/O loop) A connection attempt ended."""
        address = conn.address
        with self._lock:
            if self._connecting.get(address) is conn:
                del self._connecting[address]
            direct, report = self._attempts.pop(conn, (False, True))
            if error is None and self._stopping:  # stop() began during the handshake
                conn.close(0)
            elif error is None:
                self._links[address] = conn.responder
                self.discovery.connected(address)
                self._rdy.send(self.flow.add(conn.responder, conn.max_rdy_count, time.monotonic()))
            self._settling.notify_all()
        if error is None:
            if conn.max_rdy_count < self.config.max_in_flight:
                log.info("%s: max_rdy_count %d is below max_in_flight %d", address, conn.max_rdy_count,
                         self.config.max_in_flight)
            return
        if self._stopping:
            return
        err = error if isinstance(error, NSQError) else TransportError(str(error), address)
        self._connect_failed(address, err, direct, report)

    def _connect_failed(self, address: str, err: NSQError, direct: bool, report: bool) -> None:
        if direct:
            self.discovery.schedule_reconnect(address)
        if fdlimit.out_of_descriptors(err):  # said once per process, in one line
            if fdlimit.first_time():
                log.warning("%s", fdlimit.advice())
            report = False
        with self._lock:
            collecting = self._start_errors is not None
            if collecting:  # start() is waiting: it decides what to say
                self._start_errors.append(err)
        if report and not collecting:
            self._report(err)

    # -- connection events, through _ConnEvents (the I/O loop: never block) -----------------
    def _on_messages(self, conn: Connection, msgs: list, nbytes: int) -> None:
        """``msgs`` from one read, ``nbytes`` the bytes of their bodies."""
        link = conn.responder  # already attached to each message by the decoder
        link.received += len(msgs)
        link.last_message = time.time()
        mode = self._mode
        work = mode.split(msgs)
        with self._lock:  # one lock a batch: flow, held messages, outstanding batches
            changes = self.flow.received(link, len(msgs), time.monotonic(), nbytes)
            if changes:
                self._rdy.send(changes)
            mode.arrived(work)
        mode.dispatch(link, work)

    def _on_server_error(self, conn: Connection, err: ServerError) -> None:
        """An error frame. The non-fatal ones (a FIN/REQ/TOUCH for a message that had already
        timed out on nsqd) leave the connection open: counted and reported."""
        if not err.fatal:  # only E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED: answered too late
            with self._lock:
                conn.responder.timed_out += 1
        self._report(err)

    def _on_close(self, conn: Connection, error: BaseException | None) -> None:
        lookupd_found = False
        with self._lock:
            link = self._links.get(conn.address)
            if link is not None and link.conn is conn:
                del self._links[conn.address]
                self._rdy.forget(link)
                self._late_closed += conn.late_messages
                self._timed_out_closed += link.timed_out
                closed = self._closed_counts
                closed[0] += link.received
                closed[1] += link.finished
                closed[2] += link.requeued
                self._rdy.send(self.flow.remove(link, time.monotonic()))
                lookupd_found = conn.address not in self.nsqd_addresses
                if self._pull is not None:
                    self._pull.forget_conn(conn)
        if self._stopping:
            return
        if error is not None:
            self._report(error if isinstance(error, NSQError) else TransportError(str(error), conn.address))
        if conn.address in self.nsqd_addresses:
            self.discovery.schedule_reconnect(conn.address)
        if lookupd_found and self.lookupd_addresses:
            self.discovery.lost_lookupd_producer(conn.address)

    # -- responses (any thread: nsqcli.client.responses) -------------------------------------
    def _settle(self, link: Link, n: int, kind: str) -> None:
        """``n`` messages of ``link`` answered (kind "fin", "req", "req_backoff") or not
        (kind "lost": the connection was gone): flow control and counts."""
        with self._lock:
            flow = self.flow
            flow.settled(link, n)
            if kind == "fin":
                link.finished += n
                if flow.in_backoff:
                    self._rdy.send(flow.success(time.monotonic()))
            elif kind == "lost":
                link.lost += n
                self.lost_responses += n
            else:
                link.requeued += n
                now = time.monotonic()
                self._rdy.send(flow.failure(now) if kind == "req_backoff" else flow.neutral(now))
        if flow.backoff_until is not None:
            self._wake()

    def finish_many(self, msgs: list) -> list:
        """FIN many messages, one write per connection (batch handlers, held batches). Returns
        the messages whose FIN could not be delivered (their connection is gone: nsqd will
        deliver them again)."""
        return self._responses.finish_many(msgs)

    def requeue_many(self, msgs: list, delay: float = 0.0, backoff: bool = False) -> list:
        """REQ many messages (after ``delay`` seconds); returns those that could not be delivered."""
        return self._responses.requeue_many(msgs, delay, backoff)

    def touch_many(self, msgs: list) -> list:
        """TOUCH many un-answered messages (resets nsqd's timeout); returns those whose
        connection is gone."""
        return self._responses.touch_many(msgs)

    # -- held batches (pull=True) ----------------------------------------------------------------
    def poll(self, max_messages: int, timeout: float | None = None) -> list:
        """Up to ``max_messages`` messages, waiting up to ``timeout`` seconds for the first one
        (None: forever, 0: don't wait). They stay in flight (un-FINed) until answered with
        finish_many / requeue_many; held messages - from their arrival, polled or not - are
        TOUCHed every ``touch_interval`` (at most half the negotiated msg_timeout) when the
        config sets one. Memory is bounded by max_in_flight: nsqd sends no more than that.
        Call poll() from one thread at a time; answers may come from any thread."""
        if self._pull is None:
            raise RuntimeError("poll() needs Consumer(..., pull=True)")
        return self._pull.poll(max_messages, timeout)

    @property
    def held(self) -> int:
        """Messages received and not answered yet (taken by poll() or waiting for it)."""
        return 0 if self._pull is None else len(self._pull.held)

    # -- the control thread: timers only (RDY, backoff, TOUCH of held messages) --------------
    def _wake(self) -> None:
        workers.TIMERS.wake(self)

    def _timer_step(self, now: float) -> float:
        """(the shared timer thread) RDY, backoff, TOUCH; returns seconds until the next step."""
        if self._stopping:
            return 1.0
        try:
            with self._lock:
                self._rdy.send(self.flow.tick(now))
                self._rdy.flush_due(now)
            if self._pull is not None:
                self._pull.touch_due(now)
        except Exception as e:  # report, keep going
            self._report(e)
        return self._control_timeout()

    def _control_timeout(self) -> float:
        now = time.monotonic()
        with self._lock:
            t = min(self.flow.next_wakeup(now), self._rdy.flush_due(now))
        touch_in = None if self._pull is None else self._pull.next_touch_in(now)
        if touch_in is not None:
            t = min(t, touch_in)
        return max(0.005, min(t, 1.0))
