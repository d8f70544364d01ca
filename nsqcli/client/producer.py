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

from .config import Config
from .conn import Connection
from ..errors import (LocalProtocolError, NSQError, PublishError, ServerError, Timeout,
                     TransportError)
from ..protocol import encode_dpub, encode_mpub, encode_pub, validate_topic


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


class _Link:
    """A connection plus the FIFO of futures waiting for its responses."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.pending: collections.deque[Future] = collections.deque()
        self.lock = threading.Lock()


class Producer:
    def __init__(self, addresses: str | list[str], config: Config | None = None,
                 fanout: bool = False):
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
            link = _Link(Connection(address, self.config, self, name="producer"))
            link.conn.connect()
            self._links[address] = link
            return link

    def connect(self) -> list[str]:
        """Connect now (otherwise the first publish connects). Returns the connected addresses."""
        targets = self.addresses if self.fanout else [self._active_link().conn.address]
        for a in targets:
            self._link(a)
        return targets

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
            fut.set_result(data)

    def on_error(self, conn: Connection, err: ServerError) -> None:
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
        saying how many messages were acknowledged if any batch fails."""
        validate_topic(topic)
        batches = self.batches(list(bodies), batch_size)
        if not batches:
            raise LocalProtocolError("MPUB needs at least one message")
        if self.fanout:
            for b in batches:
                self._sync_fanout(encode_mpub(topic, b), len(b), timeout)
            return PublishResult(sum(map(len, batches)), len(batches), list(self.addresses))
        done = 0
        inflight: collections.deque = collections.deque()
        link = self._active_link()
        try:
            for b in batches:
                inflight.append((len(b), self._send(link, encode_mpub(topic, b))))
                if len(inflight) >= window:
                    n, fut = inflight.popleft()
                    self._wait(fut, timeout, link.conn.address)
                    done += n
            while inflight:
                n, fut = inflight.popleft()
                self._wait(fut, timeout, link.conn.address)
                done += n
        except NSQError as e:
            total = sum(map(len, batches))
            raise PublishError(f"published {done} of {total} messages to {link.conn.address} "
                               f"before an error: {e}", done, total - done, e) from e
        return PublishResult(done, len(batches), [link.conn.address])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.conn.close()
