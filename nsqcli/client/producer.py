"""Producer: PUB / MPUB / DPUB with responses correlated in order.

nsqd answers the commands of one connection in order, so each connection keeps a FIFO of
futures: a command's future is queued, then the command is written; the I/O thread resolves the
head on ``OK`` or an error frame. ``publish``/``multi_publish`` block until nsqd said OK (or raise
a typed error); ``publish_async``/``multi_publish_async`` return futures and keep many commands in
flight on one connection.

With several nsqd addresses the producer publishes to one and fails over to the next when a
connection cannot be made or is lost; ``fanout=True`` publishes every message to all of them
(the Go to_nsq's behaviour). A message counts as published only when nsqd acknowledged it.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

import time
from collections.abc import Callable, Iterable

from .config import Config
from .conn import Connection
from ..errors import (LocalProtocolError, NSQError, PublishError, RemoteProtocolError, ServerError,
                      Timeout, TransportError)
from ..protocol import encode_dpub, encode_mpub, encode_mpub_framed, encode_pub, split_framed, validate_topic
from ..protocol.session import check_ok


class Future:
    """The answer nsqd will give to one command: ``result(timeout)`` returns the response bytes
    or raises the error. (A small stand-in for concurrent.futures.Future, whose import - with
    logging - costs ~9 ms of `nsqcli pub` start-up.)"""

    __slots__ = ("_event", "_result", "_error")

    def __init__(self):
        self._event = threading.Event()
        self._result: bytes | None = None
        self._error: BaseException | None = None

    def set_result(self, data: bytes) -> None:
        self._result = data
        self._event.set()

    def set_exception(self, err: BaseException) -> None:
        self._error = err
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout: float | None = None) -> bytes:
        if not self._event.wait(timeout):
            raise TimeoutError("no answer yet")
        if self._error is not None:
            raise self._error
        return self._result


@dataclass
class PublishResult:
    """What a multi-publish achieved: ``published`` messages acknowledged, in ``batches``."""

    published: int
    batches: int
    nsqd: list[str]
    retries: int = 0      # rounds over every address after all had failed (publish_iter retries)


class Framed:
    """A batch encoded before it reaches the producer (by a columnar writer, with no Python
    object per message): ``count`` messages for ``topic`` whose ``payload`` is
    ``([size][body])*``, sent as one MPUB; or, with ``defer_ms``, one message sent as DPUB."""

    __slots__ = ("topic", "payload", "count", "defer_ms")

    def __init__(self, topic: str, payload, count: int, defer_ms: int | None = None):
        self.topic = topic
        self.payload = payload
        self.count = count
        self.defer_ms = defer_ms

    def __len__(self) -> int:
        return self.count

    def command(self) -> bytes:
        if self.defer_ms is not None:
            return encode_dpub(self.topic, self.defer_ms, bytes(self.payload)[4:])
        return encode_mpub_framed(self.topic, self.count, self.payload)

    def bodies(self) -> list[bytes]:
        return split_framed(self.payload)


#: nsqd errors after which the same batch may succeed later or elsewhere (nsqd exiting, disk)
RETRIABLE = ("E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED")


class _Link:
    """A connection plus the FIFO of futures waiting for its responses."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.pending: collections.deque[Future] = collections.deque()
        self.lock = threading.Lock()


class Producer:
    def __init__(self, addresses: str | list[str], config: Config | None = None,
                 fanout: bool = False, deadline: float | None = None, dial=None):
        """``deadline`` (time.monotonic()) bounds every connection attempt (a CLI's --timeout);
        ``dial`` replaces the socket stream (tests)."""
        self.deadline = deadline
        self._dial = dial
        self.addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.addresses:
            raise ValueError("Producer needs at least one nsqd address")
        self.config = config or Config()
        self.fanout = fanout
        self._links: dict[str, _Link] = {}
        self._current = 0
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- connection management -------------------------------------------------------------
    def _link(self, address: str) -> _Link:
        with self._lock:
            link = self._links.get(address)
            if link is not None and link.conn.alive:
                return link
            if self._closed:
                raise TransportError("producer is closed", address)
            link = _Link(Connection(address, self.config, self, name="producer", dial=self._dial))
            link.conn.connect(deadline=self.deadline)
            self._links[address] = link
            return link

    def connect(self) -> list[str]:
        """Connect now (otherwise the first publish connects). Returns the connected addresses."""
        targets = self.addresses if self.fanout else [self._active_link().conn.address]
        for a in targets:
            self._link(a)
        return targets

    def rotate(self) -> None:
        """Make the next address the current one (round-robin over destinations)."""
        with self._lock:
            self._current = (self._current + 1) % len(self.addresses)

    def _active_link(self) -> _Link:
        """The current nsqd, failing over to the next address when it cannot be reached."""
        errors = []
        for i in range(len(self.addresses)):
            idx = (self._current + i) % len(self.addresses)
            try:
                link = self._link(self.addresses[idx])
            except TransportError as e:
                errors.append(e)
                continue
            self._current = idx
            return link
        if len(errors) == 1:
            raise errors[0]
        raise TransportError("no nsqd reachable: " + "; ".join(str(e) for e in errors))

    # -- delegate callbacks (I/O thread) ----------------------------------------------------
    def _link_of(self, conn: Connection) -> _Link | None:
        link = self._links.get(conn.address)
        return link if link is not None and link.conn is conn else None

    def _pop(self, conn: Connection) -> Future | None:
        """The future of the oldest unanswered command on this connection (nsqd answers in order)."""
        link = self._link_of(conn)
        if link is None:
            return None
        with link.lock:
            return link.pending.popleft() if link.pending else None

    def on_response(self, conn: Connection, data: bytes) -> None:
        fut = self._pop(conn)
        if fut is not None:
            try:  # only OK acknowledges a publish (not CLOSE_WAIT, not anything else)
                check_ok(data, "a publish")
            except RemoteProtocolError as e:
                fut.set_exception(RemoteProtocolError(f"{conn.address}: {e}"))
                return
            fut.set_result(data)

    def on_server_error(self, conn: Connection, err: ServerError) -> None:
        fut = self._pop(conn)
        if fut is not None:
            fut.set_exception(err)

    def on_close(self, conn: Connection, error: BaseException | None) -> None:
        link = self._link_of(conn)
        if link is None:
            return
        with link.lock:
            waiting, link.pending = list(link.pending), collections.deque()
        exc = TransportError(f"connection lost before nsqd answered ({error or 'closed'})", conn.address)
        for fut in waiting:
            if not fut.done():
                fut.set_exception(exc)

    def on_messages(self, conn: Connection, msgs: list) -> None:  # never for a producer
        pass

    # -- sending ----------------------------------------------------------------------------
    def _send(self, link: _Link, command: bytes) -> Future:
        fut: Future = Future()
        with link.lock:
            link.pending.append(fut)
            try:
                link.conn.write(command)
            except TransportError as e:
                link.pending.pop()
                fut.set_exception(e)
        return fut

    def _command_async(self, command: bytes) -> list[Future]:
        if self.fanout:
            return [self._send(self._link(a), command) for a in self.addresses]
        return [self._send(self._active_link(), command)]

    def publish_async(self, topic: str, body: bytes, defer: float | None = None) -> list[Future]:
        """Queue a PUB (or DPUB with ``defer`` seconds); one future per nsqd (several with fanout)."""
        command = encode_pub(topic, body) if defer is None else encode_dpub(topic, int(defer * 1000), body)
        return self._command_async(command)

    def publish(self, topic: str, body: bytes, defer: float | None = None,
                timeout: float = 10.0) -> list[str]:
        """PUB one message; returns the nsqd addresses that acknowledged it. Fails over to the
        next nsqd when the connection is lost before the answer."""
        command = encode_pub(topic, body) if defer is None else encode_dpub(topic, int(defer * 1000), body)
        return self._sync(command, 1, timeout)

    def _sync(self, command: bytes, count: int, timeout: float) -> list[str]:
        if self.fanout:
            return self._sync_fanout(command, count, timeout)
        errors: list[NSQError] = []
        for _ in range(len(self.addresses)):
            try:
                link = self._active_link()
                self._wait(self._send(link, command), timeout, link.conn.address)
                return [link.conn.address]
            except TransportError as e:  # unreachable or connection lost: try the next nsqd
                errors.append(e)
                self._current = (self._current + 1) % len(self.addresses)
            except NSQError as e:  # nsqd answered with an error: do not retry elsewhere
                raise PublishError(f"not published: {e}", 0, count, e) from e
        raise PublishError(f"not published ({count} message{'s' * (count != 1)}): "
                           + "; ".join(dict.fromkeys(str(e) for e in errors)), 0, count, errors[-1])

    def _sync_fanout(self, command: bytes, count: int, timeout: float) -> list[str]:
        ok, failed = [], []
        for address in self.addresses:
            try:
                self._wait(self._send(self._link(address), command), timeout, address)
                ok.append(address)
            except NSQError as e:
                failed.append(e)
        if failed:
            raise PublishError(
                f"published to {len(ok)} of {len(self.addresses)} nsqd"
                + (f" ({', '.join(ok)})" if ok else "") + "; failed: " + "; ".join(map(str, failed)),
                count if ok else 0, count, failed[0])
        return ok

    @staticmethod
    def _wait(fut: Future, timeout: float, address: str) -> bytes:
        try:
            return fut.result(timeout)
        except TimeoutError as e:
            raise Timeout(f"no answer from nsqd within {timeout}s", address) from e

    # -- MPUB -------------------------------------------------------------------------------
    def batches(self, bodies: list[bytes], batch_size: int = 0) -> list[list[bytes]]:
        """Split bodies into MPUB batches that respect max_body_size (and batch_size if > 0).
        A single body over max_msg_size raises LocalProtocolError naming its index."""
        limit, max_msg = self.config.max_body_size, self.config.max_msg_size
        out: list[list[bytes]] = []
        cur: list[bytes] = []
        size = 4
        for i, body in enumerate(bodies):
            n = len(body)
            if n > max_msg:
                raise LocalProtocolError(f"message {i + 1} is {n} bytes, over the {max_msg}-byte "
                                         "max message size")
            if cur and (size + 4 + n > limit or (batch_size and len(cur) >= batch_size)):
                out.append(cur)
                cur, size = [], 4
            cur.append(body)
            size += 4 + n
        if cur:
            out.append(cur)
        return out

    def multi_publish(self, topic: str, bodies: list[bytes], batch_size: int = 0,
                      timeout: float = 30.0, window: int = 16) -> PublishResult:
        """MPUB all bodies in batches, up to ``window`` batches in flight. Raises PublishError
        saying how many messages were acknowledged if any batch fails; a body over
        max_msg_size is refused before anything is sent."""
        validate_topic(topic)
        bodies = list(bodies)
        if not bodies:
            raise LocalProtocolError("MPUB needs at least one message")
        if self.fanout:
            batches = self.batches(bodies, batch_size)
            for b in batches:
                self._sync_fanout(encode_mpub(topic, b), len(b), timeout)
            return PublishResult(len(bodies), len(batches), list(self.addresses))
        max_msg = self.config.max_msg_size
        if max(map(len, bodies)) > max_msg:
            i, body = next((i, b) for i, b in enumerate(bodies) if len(b) > max_msg)
            raise LocalProtocolError(f"message {i + 1} is {len(body)} bytes, over the "
                                     f"{max_msg}-byte max message size")
        return self.publish_iter(topic, bodies, batch_size=batch_size, timeout=timeout, window=window)

    def publish_iter(self, topic: str, bodies: Iterable[bytes], *, batch_size: int = 0,
                     window: int = 8, timeout: float = 30.0, rate: float | None = None,
                     on_progress: Callable[[int], None] | None = None,
                     retries: int = 0, retry_backoff: float = 1.0) -> PublishResult:
        """Publish an iterable of any length in bounded memory: MPUB batches under
        max_body_size (and ``batch_size``), up to ``window`` in flight, each OK awaited in order.

        ``rate`` (messages/s) paces batches so that no second sees more than ~5 % over it.
        ``on_progress(acknowledged)`` is called as OKs arrive. A connection lost mid-way fails
        over to the next nsqd address (unacknowledged batches are sent again: at-least-once).
        A batch nsqd refuses as a whole (E_BAD_MESSAGE) is retried message by message so the
        ones before the bad one are published. On any failure - including KeyboardInterrupt or
        an exception raised by the iterable - PublishError says exactly how many messages nsqd
        acknowledged: the first ``published`` messages, in order.

        ``retries``: when every nsqd address failed (unreachable, connection lost, or nsqd
        answered E_PUB_FAILED/E_MPUB_FAILED), wait ``retry_backoff`` seconds (doubling, at most
        30) and go round the addresses again, this many times, before giving up."""
        validate_topic(topic)
        return _IterPublish(self, topic, batch_size, window, timeout, rate, on_progress,
                            retries, retry_backoff).run(bodies)

    def publish_framed(self, frames: Iterable[Framed], *, window: int = 8, timeout: float = 30.0,
                       rate: float | None = None, on_progress: Callable[[int], None] | None = None,
                       retries: int = 0, retry_backoff: float = 1.0) -> PublishResult:
        """publish_iter for batches already encoded (:class:`Framed`, any topics): the same
        window, pacing, failover, retries and exact acknowledged count."""
        return _IterPublish(self, "", 0, window, timeout, rate, on_progress,
                            retries, retry_backoff).run_framed(frames)

    def close(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout``) for nsqd's answer to every command sent, then close. Every
        future is resolved before this returns: OK, nsqd's error, or a TransportError saying the
        answer never came."""
        with self._lock:
            self._closed = True
            links = list(self._links.values())
        deadline = time.monotonic() + timeout
        for link in links:
            with link.lock:
                waiting = list(link.pending)
            for fut in waiting:
                if not fut._event.wait(max(0.0, deadline - time.monotonic())):
                    break
        for link in links:
            link.conn.close(max(0.1, deadline - time.monotonic()))
        for link in links:
            with link.lock:
                waiting, link.pending = list(link.pending), collections.deque()
            exc = TransportError("producer closed before nsqd answered", link.conn.address)
            for fut in waiting:
                if not fut.done():
                    fut.set_exception(exc)
        with self._lock:
            self._links = {}


class Pacer:
    """Paces work at ``rate`` items per second from its creation: ``wait(n)`` returns when the
    n items' turn has come, so no second sees more than the rate plus one call's worth."""

    def __init__(self, rate: float):
        self.rate = rate
        self.t0 = time.monotonic()
        self.sent = 0

    def wait(self, n: int) -> None:
        self.sent += n
        delay = self.t0 + self.sent / self.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class _IterPublish:
    """The state of one publish_iter call (see Producer.publish_iter)."""

    def __init__(self, producer: Producer, topic: str, batch_size: int, window: int,
                 timeout: float, rate: float | None, on_progress, retries: int = 0,
                 retry_backoff: float = 1.0):
        self.p = producer
        self.topic = topic
        if rate:
            cap = max(1, int(rate / 20))  # a batch is at most 50 ms of the rate
            batch_size = min(batch_size or cap, cap)
        self.batch_size = batch_size
        self.window = max(1, window)
        self.timeout = timeout
        self.rate = rate
        self.on_progress = on_progress
        self.inflight: collections.deque = collections.deque()  # (bodies, future, address)
        self.done = 0
        self.batches = 0
        self.taken = 0
        self.failovers = 0
        self.addresses: list[str] = []
        self.pacer = Pacer(rate) if rate else None
        self.retries_left = max(0, retries)
        self.retry_backoff = retry_backoff
        self.retried = 0
        self.source_error: BaseException | None = None

    def run(self, bodies: Iterable[bytes]) -> PublishResult:
        return self._drive(self._batches(bodies))

    def run_framed(self, frames: Iterable[Framed]) -> PublishResult:
        return self._drive(self._counted(frames))

    def _batches(self, bodies: Iterable[bytes]):
        """MPUB batches of the caller's bodies. An error of the iterable (or a bad body) ends
        the batches, keeping what came before (the last partial batch still goes out)."""
        cfg = self.p.config
        limit, max_msg, batch_size = cfg.max_body_size, cfg.max_msg_size, self.batch_size or (1 << 62)
        cur: list[bytes] = []
        append = cur.append
        size = 4
        taken = 0
        try:
            for body in bodies:  # hot loop: locals only
                if type(body) is not bytes:
                    body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
                n = len(body)
                if n == 0 or n > max_msg:
                    why = "is empty" if n == 0 else f"is {n} bytes, over the {max_msg}-byte max message size"
                    raise LocalProtocolError(f"message {taken + 1} {why}")
                if size + 4 + n > limit or len(cur) >= batch_size:
                    self.taken = taken
                    yield cur
                    cur = []
                    append = cur.append
                    size = 4
                append(body)
                size += 4 + n
                taken += 1
        except GeneratorExit:  # closed by _drive after a send failed
            raise
        except BaseException as e:  # the iterable failed (or a signal): what came before still goes out
            self.source_error = e
        finally:
            self.taken = taken
        if cur:
            yield cur

    def _counted(self, frames: Iterable[Framed]):
        try:
            for frame in frames:
                self.taken += frame.count
                yield frame
        except GeneratorExit:
            raise
        except BaseException as e:  # building the frames failed: what came before still goes out
            self.source_error = e

    def _drive(self, batches) -> PublishResult:
        """Send every batch (windowed, paced), settle them all; on any failure raise
        PublishError with the exact acknowledged count."""
        try:
            for batch in batches:
                self._send(batch)
            self._settle_all()
        except BaseException as e:
            batches.close()
            self._fail(e)
        if self.source_error is not None:
            self._fail(self.source_error)
        return PublishResult(self.done, self.batches, self.addresses, self.retried)

    def _retry_pause(self, error: BaseException) -> None:
        """Every address failed: wait and go round again, or re-raise when no retry is left."""
        if self.retries_left <= 0:
            raise error
        self.retries_left -= 1
        time.sleep(min(30.0, self.retry_backoff * (2 ** self.retried)))
        self.retried += 1
        self.failovers = 0

    def _link(self) -> _Link:
        while True:
            try:
                return self.p._active_link()
            except TransportError as e:
                self._retry_pause(e)

    def _send(self, batch: list[bytes]) -> None:
        """Pace, MPUB, and keep at most ``window`` batches waiting for their OK."""
        if not batch:
            return
        if self.pacer is not None:
            self.pacer.wait(len(batch))
        self._enqueue(batch)
        self.batches += 1
        while len(self.inflight) >= self.window:
            self._settle_one()

    def _enqueue(self, batch) -> None:
        link = self._link()
        address = link.conn.address
        if address not in self.addresses:
            self.addresses.append(address)
        command = batch.command() if type(batch) is Framed else encode_mpub(self.topic, batch)
        self.inflight.append((batch, self.p._send(link, command), address))

    def _settle_all(self) -> None:
        while self.inflight:
            self._settle_one()

    def _settle_one(self) -> None:
        batch, fut, address = self.inflight[0]
        try:
            Producer._wait(fut, self.timeout, address)
        except ServerError as e:
            if e.code in ("E_BAD_MESSAGE", "E_BAD_BODY") and len(batch) > 1:
                self.inflight.clear()  # nsqd closed the connection: later batches are lost
                self._one_by_one(batch)
                return
            if e.code not in RETRIABLE:
                raise
            self._failover(e)
        except TransportError as e:
            self._failover(e)
        else:
            self.inflight.popleft()
            self._acked(len(batch))

    def _failover(self, error: BaseException) -> None:
        """The head batch got no OK: send it and everything after it again on the next nsqd."""
        if self.failovers >= len(self.p.addresses) - 1:
            self._retry_pause(error)
        else:
            self.failovers += 1
        self.p._current = (self.p._current + 1) % len(self.p.addresses)
        again = [b for b, _, _ in self.inflight]
        self.inflight.clear()
        for b in again:  # not acknowledged: send again, in order, on the next nsqd
            self._enqueue(b)

    def _one_by_one(self, batch) -> None:
        topic = batch.topic if type(batch) is Framed else self.topic
        for body in (batch.bodies() if type(batch) is Framed else batch):
            self.p._sync(encode_pub(topic, body), 1, self.timeout)
            self._acked(1)

    def _acked(self, n: int) -> None:
        self.done += n
        if self.on_progress is not None:
            self.on_progress(self.done)

    def _fail(self, e: BaseException) -> None:
        """Settle what is in flight (OKs count, in order, until the first failure), then raise
        PublishError with the exact acknowledged count."""
        try:
            while self.inflight:
                batch, fut, address = self.inflight.popleft()
                Producer._wait(fut, self.timeout, address)
                self._acked(len(batch))
        except BaseException:
            pass
        cause = e.cause if isinstance(e, PublishError) and e.cause is not None else e
        if not isinstance(e, Exception):  # KeyboardInterrupt, a signal, SystemExit
            message = f"interrupted: published {self.done} of {self.taken} messages"
        else:
            message = f"published {self.done} of {self.taken} messages before an error: {cause}"
        raise PublishError(message, self.done, max(0, self.taken - self.done), cause) from e
