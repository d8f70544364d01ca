"""Producer: PUB / MPUB / DPUB, each answered through a future.

nsqd answers the commands of one connection in order; the connection's session
(nsqcli.protocol.session) matches every publish to its answer and the connection resolves the
future: OK, nsqd's error, or a TransportError when the connection closed first. Publishing many
batches (``publish_iter``, ``publish_framed``, ``multi_publish``) is counted in one
:class:`~nsqcli.client.ledger.Ledger`, driven by nsqcli.client.publish_iter. ``publish``/``multi_publish``
block until nsqd said OK (or raise a typed error); ``publish_async`` returns futures and keeps many
commands in flight on one connection.

With several nsqd addresses the producer publishes to one and fails over to the next when a
connection cannot be made or is lost; ``fanout=True`` publishes every message to all of them
(the Go to_nsq's behaviour). A message counts as published only when nsqd acknowledged it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from .config import Config
from .conn import Connection, ConnectionDelegate
from .future import Future, Stopped
from ..errors import NSQError, PublishError, Timeout, TransportError
from ..protocol import encode_dpub, encode_mpub, encode_pub, validate_topic

#: names that live in nsqcli.client.publish_iter, importable from here too; loaded when first
#: asked for - ``nsqcli pub`` publishes one message and never needs them (start-up)
_FROM_PUBLISH_ITER = ("FLUSH", "Framed", "Pacer", "PublishResult", "measure")


def __getattr__(name: str):
    if name in _FROM_PUBLISH_ITER:
        from . import publish_iter

        return getattr(publish_iter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: how often a wait for nsqd's answer looks at a stop event (Producer.stop, publish_iter's stop)
STOP_POLL = 0.1


class _ProducerConnDelegate(ConnectionDelegate):
    """What a producer's connections tell it (go-nsq's producerConnDelegate), on their I/O
    loop. Nothing needs the producer there: every publish is answered through its future,
    which the connection itself resolves (OK, nsqd's error, or a TransportError when it closes
    first); a producer subscribes to nothing, so no messages come; a stray error frame or
    CLOSE_WAIT answers no publish, and a closed connection is found dead (``alive``) by the
    next publish, which makes a new one. So the interface's defaults (do nothing) are all it
    needs, and Producer keeps no connection callbacks in its public surface."""


#: one for every producer connection: it holds no state
_CONN_DELEGATE = _ProducerConnDelegate()


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
        self._links: dict[str, Connection] = {}
        self._current = 0
        self._lock = threading.Lock()
        self._closed = False
        #: runs each connection attempt, ``connecting(fn) -> fn()`` (the CLI's GracefulStop.call:
        #: on a thread of its own, so that a signal during a handshake that never ends raises in
        #: the waiting thread, never inside the attempt)
        self.connecting = None
        #: a threading.Event: once set, a wait for nsqd's answer (publish, DPUB) ends within
        #: STOP_POLL seconds with :class:`Stopped` instead of waiting out its timeout
        self.stop = None
        #: the publish_iter / publish_framed in progress (what it wrote and what nsqd answered
        #: can be read at any moment: a forced exit reports it)
        self.publishing: IterPublish | None = None
        #: the nsqd a single publish was written to before its connection was lost unanswered,
        #: before it was sent to the next one (``publish``): they may hold it too
        self.maybe_held: list[str] = []
        #: ``on_publish(address, state)``: a single publish (``publish``) is about to be written
        #: to ``address`` (state "sent"), or nsqd there acknowledged it ("acknowledged")
        self.on_publish = None

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- connection management -------------------------------------------------------------
    def _link(self, address: str, share: int = 1) -> Connection:
        """The connection to ``address``, made now if there is none. With a ``deadline`` the
        handshake may take the rest of it (divided by ``share``: the attempts still to make),
        not just dial_timeout + handshake_timeout - the deadline is the caller's whole budget."""
        with self._lock:
            conn = self._links.get(address)
            if conn is not None and conn.alive:
                return conn
            if self._closed:
                raise TransportError("producer is closed", address)
            cfg = self.config
            if self.deadline is not None:
                # this address's share of what is left: more than the usual handshake deadline
                # when there is time, less when later addresses must still get their turn (a
                # hung first nsqd took the whole --timeout and the healthy second never came)
                turn = (self.deadline - time.monotonic()) / max(1, share)
                dial = min(cfg.dial_timeout, max(0.05, turn / 2))
                budget = max(0.05, turn - dial)
                if share > 1 or budget > cfg.handshake_timeout:
                    cfg = cfg.replace(dial_timeout=dial, handshake_timeout=budget)
            conn = Connection(address, cfg, _CONN_DELEGATE, name="producer", dial=self._dial)
            if self.connecting is None:
                conn.connect(deadline=self.deadline)
            else:
                try:
                    self.connecting(lambda: conn.connect(deadline=self.deadline))
                except BaseException:  # the wait was interrupted: the handshake must not go on
                    conn.abort()
                    raise
            self._links[address] = conn
            return conn

    def _drop(self, conn: Connection) -> None:
        """Close a connection whose answers can no longer be trusted (a publish timed out):
        nothing it says later can count, and its waiting futures fail now."""
        with self._lock:
            if self._links.get(conn.address) is conn:
                del self._links[conn.address]
        linger = 0.5 if self.deadline is None else max(0.0, min(0.5, self.deadline - time.monotonic()))
        conn.close(linger)  # nothing to wait for past the deadline

    def connect(self) -> list[str]:
        """Connect now (otherwise the first publish connects). Returns the connected addresses."""
        targets = self.addresses if self.fanout else [self.connection().address]
        for i, a in enumerate(targets):
            self._link(a, len(targets) - i)
        return targets

    def rotate(self) -> None:
        """Make the next address the current one (round-robin over destinations)."""
        with self._lock:
            self._current = (self._current + 1) % len(self.addresses)

    def connection(self) -> Connection:
        """The connection to the current nsqd, failing over to the next address when it cannot
        be reached (TransportError when none can)."""
        errors = []
        n = len(self.addresses)
        for i in range(n):
            idx = (self._current + i) % n
            try:
                link = self._link(self.addresses[idx], n - i)
            except TransportError as e:
                errors.append(e)
                continue
            self._current = idx
            return link
        if len(errors) == 1:
            raise errors[0]
        raise TransportError("no nsqd reachable: " + "; ".join(str(e) for e in errors))

    # -- sending ----------------------------------------------------------------------------
    @staticmethod
    def _send(conn: Connection, command: bytes) -> Future:
        """Write a publish; its future is resolved by ``conn`` alone (never by a connection
        that replaced it)."""
        fut: Future = Future()
        try:
            conn.send(command, fut)
        except TransportError as e:
            fut.set_exception(e)
        return fut

    def _command_async(self, command: bytes) -> list[Future]:
        if self.fanout:
            return [self._send(self._link(a), command) for a in self.addresses]
        return [self._send(self.connection(), command)]

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

    def _left(self, timeout: float) -> float:
        """``timeout``, cut to what is left of ``deadline`` (counted when the wait starts: a
        handshake before it has spent its share)."""
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
        return max(0.001, timeout)

    def _sending(self, address: str, state: str) -> None:
        if self.on_publish is not None:
            self.on_publish(address, state)

    def _sync(self, command: bytes, count: int, timeout: float) -> list[str]:
        self.maybe_held = []
        if self.fanout:
            return self._sync_fanout(command, count, timeout)
        errors: list[NSQError] = []
        for _ in range(len(self.addresses)):
            try:
                conn = self.connection()
            except TransportError as e:  # no nsqd reachable at all
                errors.append(e)
                break
            except NSQError as e:  # refused at the handshake (AUTH)
                raise PublishError(f"not published: {e}", 0, count, e) from e
            try:
                self._sending(conn.address, "sent")
                self.await_answer(self._send(conn, command), self._left(timeout), conn)
                self._sending(conn.address, "acknowledged")
                return [conn.address]
            except Timeout as e:  # no answer: it may be published; sending it again may duplicate it
                raise PublishError(f"not known whether published: {e}", 0, count, e) from e
            except TransportError as e:  # unreachable or connection lost: try the next nsqd
                errors.append(e)
                if getattr(e, "not_processed", True) is False:  # written, lost before the answer
                    self.maybe_held.append(conn.address)
                self._current = (self._current + 1) % len(self.addresses)
            except NSQError as e:  # nsqd answered with an error: do not retry elsewhere
                raise PublishError(f"not published: {e}", 0, count, e) from e
        unknown = any(getattr(e, "not_processed", True) is False for e in errors)
        raise PublishError(f"{'not known whether published' if unknown else 'not published'} "
                           f"({count} message{'s' * (count != 1)}): "
                           + "; ".join(dict.fromkeys(str(e) for e in errors)), 0, count, errors[-1])

    def _sync_fanout(self, command: bytes, count: int, timeout: float) -> list[str]:
        ok, failed = [], []
        n = len(self.addresses)
        for i, address in enumerate(self.addresses):
            try:
                conn = self._link(address, n - i)
                self._sending(address, "sent")
                self.await_answer(self._send(conn, command), self._left(timeout), conn)
                self._sending(address, "acknowledged")
                ok.append(address)
            except NSQError as e:
                failed.append(e)
        if failed:
            raise PublishError(
                f"published to {len(ok)} of {len(self.addresses)} nsqd"
                + (f" ({', '.join(ok)})" if ok else "") + "; failed: " + "; ".join(map(str, failed)),
                count if ok else 0, count, failed[0])
        return ok

    def await_answer(self, fut: Future, timeout: float, conn: Connection | None, what: str = "",
                     stop=None) -> bytes:
        """nsqd's answer; after ``timeout`` seconds without one the connection is dropped (a
        late OK must not count, and must not be mistaken for another command's) and Timeout
        raised (``what`` says what got no answer). ``stop`` (default: the producer's) set
        meanwhile: :class:`Stopped` within STOP_POLL seconds (nothing dropped: the caller
        decides what the unanswered publish means)."""
        stop = stop if stop is not None else self.stop
        try:
            if stop is None or fut.done():
                return fut.result(timeout)
            end = time.monotonic() + timeout
            while not fut.wait(min(STOP_POLL, max(0.0, end - time.monotonic()))):
                if stop.is_set():
                    raise Stopped()
                if time.monotonic() >= end:
                    break
            return fut.result(0)
        except Timeout:  # the answer itself was a Timeout: not ours to drop
            raise
        except TimeoutError:
            if conn is not None:
                self._drop(conn)
            cut = self.deadline is not None and time.monotonic() >= self.deadline - 0.01
            within = "before the deadline" if cut else f"within {round(timeout, 1):g}s"  # (a cut wait's length is chance)
            raise Timeout(f"no answer from nsqd {within}{what}",
                          conn.address if conn is not None else None) from None

    # -- many messages: nsqcli.client.publish_iter ------------------------------------------
    def batches(self, bodies: list[bytes], batch_size: int = 0) -> list[list[bytes]]:
        """Split bodies into MPUB batches that respect max_body_size (and batch_size if > 0).
        A single body over max_msg_size raises LocalProtocolError naming its index."""
        from .publish_iter import batches

        return batches(bodies, self.config.max_body_size, self.config.max_msg_size, batch_size)

    def multi_publish(self, topic: str, bodies: list[bytes], batch_size: int = 0,
                      timeout: float = 30.0, window: int = 16) -> PublishResult:
        """MPUB all bodies in batches, up to ``window`` batches in flight. Raises PublishError
        saying how many messages were acknowledged if any batch fails; a body over
        max_msg_size is refused before anything is sent."""
        from .publish_iter import IterPublish, PublishResult, checked_bodies

        validate_topic(topic)
        bodies, lens = checked_bodies(list(bodies), self.config.max_msg_size)
        if self.fanout:
            batches = self.batches(bodies, batch_size)
            for b in batches:
                self._sync_fanout(encode_mpub(topic, b), len(b), timeout)
            return PublishResult(len(bodies), len(batches), list(self.addresses))
        run = IterPublish(self, topic, batch_size, window, timeout, None, None)
        return self._run(run, run.run, [bodies], lens)

    def publish_iter(self, topic: str, bodies: Iterable[bytes], *, batch_size: int = 0,
                     window: int = 8, timeout: float = 30.0, rate: float | None = None,
                     on_progress: Callable[[int], None] | None = None,
                     retries: int = 0, retry_backoff: float = 1.0, stop=None) -> PublishResult:
        """Publish an iterable of any length in bounded memory: MPUB batches under
        max_body_size (and ``batch_size``), up to ``window`` in flight, each OK awaited in order.

        ``rate`` (messages/s) paces batches so that no second sees more than ~5 % over it.
        ``on_progress(acknowledged)`` is called as OKs arrive. Every batch is counted in one
        :class:`~nsqcli.client.ledger.Ledger`:

        - a connection lost mid-way, or nsqd's E_PUB_FAILED/E_MPUB_FAILED, sends every
          unacknowledged batch again, in order, on the next nsqd address (at-least-once: a batch
          nsqd took before the connection died may be published twice);
        - a batch nsqd refuses as too big (E_BAD_BODY, E_BAD_MESSAGE) is split and its halves
          sent; after E_BAD_BODY later batches stay under half its size (nsqd does not tell its
          --max-body-size). Only a single message can be refused: PublishError names it;
        - no answer within ``timeout``: the connection is dropped and PublishError says those
          messages may or may not be published (they are not sent again);
        - ``stop`` (a threading.Event) set: nothing more is read from ``bodies``; the batches in
          flight are settled and PublishError (cause :class:`Stopped`) reports them.

        On any failure - including an exception raised by the iterable - PublishError says
        exactly how many messages nsqd acknowledged: the first ``published`` messages, in order,
        and no other.

        A body :data:`FLUSH` (between bodies) sends the batch taken so far without waiting for
        it to fill: a source that streams slowly yields it when its linger time has passed.

        ``retries``: when every nsqd address failed (unreachable, connection lost, or nsqd
        answered E_PUB_FAILED/E_MPUB_FAILED), wait ``retry_backoff`` seconds (doubling, at most
        30) and go round the addresses again, this many times, before giving up."""
        from .publish_iter import IterPublish

        validate_topic(topic)
        run = IterPublish(self, topic, batch_size, window, timeout, rate, on_progress, retries, retry_backoff, stop)
        return self._run(run, run.run, bodies)

    def publish_framed(self, frames: Iterable[Framed], *, window: int = 8, timeout: float = 30.0,
                       rate: float | None = None, on_progress: Callable[[int], None] | None = None,
                       retries: int = 0, retry_backoff: float = 1.0, stop=None,
                       retry_for: float | None = None) -> PublishResult:
        """publish_iter for batches already encoded (:class:`Framed`, any topics): the same
        window, pacing, failover, splitting, retries and exact acknowledged count.

        ``retry_for`` (seconds) replaces ``retries`` with a time budget: once every address
        failed, go round them again (pauses from ``retry_backoff`` doubling, at most
        publish_iter.RETRY_PAUSE_MAX) until that long has passed since the first failure after the last OK."""
        from .publish_iter import IterPublish

        run = IterPublish(self, "", 0, window, timeout, rate, on_progress, retries, retry_backoff, stop)
        run.retry_for = retry_for
        return self._run(run, run.run_framed, frames)

    def _run(self, run: IterPublish, start, *args) -> PublishResult:
        """``start(*args)`` (a method of ``run``) with ``run`` as :attr:`publishing` meanwhile."""
        self.publishing = run
        try:
            return start(*args)
        finally:
            self.publishing = None

    def close(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout``) for nsqd's answer to every command sent, then close. Every
        future is resolved before this returns: OK, nsqd's error, or a TransportError saying the
        answer never came."""
        with self._lock:
            self._closed = True
            conns = list(self._links.values())
        deadline = time.monotonic() + timeout
        for conn in conns:
            for fut in conn.waiting_tokens():
                if not fut.wait(deadline - time.monotonic()):
                    break
        for conn in conns:  # what is still waiting fails as the connection closes
            conn.close(max(0.1, deadline - time.monotonic()))
        with self._lock:
            self._links = {}

