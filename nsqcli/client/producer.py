"""Producer: PUB / MPUB / DPUB, each answered through a future.

nsqd answers the commands of one connection in order; the connection's session
(nsqcli.protocol.session) matches every publish to its answer and the connection resolves the
future: OK, nsqd's error, or a TransportError when the connection closed first. Publishing many
batches (``publish_iter``, ``publish_framed``, ``multi_publish``) is counted in one
:class:`~nsqcli.client.ledger.Ledger`. ``publish``/``multi_publish`` block until nsqd said OK (or raise
a typed error); ``publish_async`` returns futures and keeps many commands in flight on one
connection.

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
from .ledger import Entry, Ledger
from .record import Record
from ..errors import LocalProtocolError, NSQError, PublishError, ServerError, Timeout, TransportError
from ..protocol import encode_dpub, encode_mpub, encode_mpub_framed, encode_pub, split_framed, validate_topic


class Future:
    """The answer nsqd will give to one command: ``result(timeout)`` returns the response bytes
    or raises the error. (A small stand-in for concurrent.futures.Future, whose import - with
    logging - costs ~9 ms of `nsqcli pub` start-up.)

    One lock, held until the answer is in: made, settled and waited for with a fraction of a
    threading.Event's work (an Event builds a Condition; its wait makes another lock), which
    is per batch on the publish path. The first settle wins."""

    __slots__ = ("_lock", "_done", "_result", "_error")

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._done = False
        self._result: bytes | None = None
        self._error: BaseException | None = None

    def set_result(self, data: bytes) -> None:
        self._settle(data, None)

    def set_exception(self, err: BaseException) -> None:
        self._settle(None, err)

    def _settle(self, data, err) -> None:
        with _SETTLE:
            if self._done:
                return
            self._result, self._error, self._done = data, err, True
        _release(self._lock)

    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        """True once settled; False if ``timeout`` seconds passed first."""
        if self._done:
            return True
        lock = self._lock
        try:
            if lock.acquire(True, -1 if timeout is None else max(0.0, timeout)):
                _release(lock)  # for any other waiter: once settled, the lock stays free
        finally:
            # a signal handler that raised (Ctrl-C) right after the acquire left the lock held:
            # every other waiter would wait for ever on a settled future
            if self._done and lock.locked():
                _release(lock)
        return self._done

    def result(self, timeout: float | None = None) -> bytes:
        if not self.wait(timeout):
            raise TimeoutError("no answer yet")
        if self._error is not None:
            raise self._error
        return self._result


_SETTLE = threading.Lock()


def _release(lock) -> None:
    """Free a settled future's lock; someone else may just have done so (a waiter passing it
    on, or one freeing what an interrupted waiter kept)."""
    try:
        lock.release()
    except RuntimeError:
        pass


class PublishResult(Record):
    """What a multi-publish achieved: ``published`` messages acknowledged, in ``batches``."""

    published: int
    batches: int
    nsqd: list[str]
    retries: int = 0      # rounds over every address after all had failed (publish_iter retries)
    resent: int = 0       # messages sent again after a connection was lost before nsqd answered
                          # them: the nsqd they were first sent to may hold them too (duplicates)


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


def interrupt_note(address: str, state: str) -> str:
    """What a command interrupted during a single publish adds to its "interrupted" line, for
    Producer.on_publish's ``state``: after the PUB was written the message may be in nsqd."""
    if state == "sent":
        return f": the message was sent to {address} and may have been published (no answer from nsqd yet)"
    return f": the message was published ({address} acknowledged it)"


def resend_note(maybe_held: list[str], acked: list[str]) -> str:
    """The warning after a publish was sent again (Producer.maybe_held): a possible duplicate."""
    return (f"the message was sent again to {', '.join(acked)} after the connection to {', '.join(maybe_held)} "
            "was lost before nsqd answered: it may be published there too (a possible duplicate)")


def size_note(size: int, error: BaseException) -> str:
    """What a failed single publish adds when its message is over nsqd's default --max-msg-size
    and nsqd did not say why: nsqd refuses such a message and closes at once, and its error
    frame can be lost to the reset while the message is still being written."""
    if size <= 1024 * 1024 or "E_BAD" in str(error):
        return ""
    return (f"; the message is {size} bytes, over nsqd's default --max-msg-size (1048576): nsqd may have "
            "refused it and closed the connection before its answer was read")


#: how often a wait for nsqd's answer looks at a stop event (Producer.stop, publish_iter's stop)
STOP_POLL = 0.1

#: nsqd errors after which the same batch may succeed later or elsewhere (nsqd exiting, disk)
RETRIABLE = ("E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED")


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
        #: a context manager around each connection attempt (the CLI's: a signal during a
        #: handshake that never ends raises there)
        self.connecting = None
        #: a threading.Event: once set, a wait for nsqd's answer (publish, DPUB) ends within
        #: STOP_POLL seconds with :class:`Stopped` instead of waiting out its timeout
        self.stop = None
        #: the publish_iter / publish_framed in progress (what it wrote and what nsqd answered
        #: can be read at any moment: a forced exit reports it)
        self.publishing: _IterPublish | None = None
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
                with self.connecting():
                    conn.connect(deadline=self.deadline)
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
        targets = self.addresses if self.fanout else [self._active_link().address]
        for i, a in enumerate(targets):
            self._link(a, len(targets) - i)
        return targets

    def rotate(self) -> None:
        """Make the next address the current one (round-robin over destinations)."""
        with self._lock:
            self._current = (self._current + 1) % len(self.addresses)

    def _active_link(self) -> Connection:
        """The current nsqd, failing over to the next address when it cannot be reached."""
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
                conn = self._active_link()
            except TransportError as e:  # no nsqd reachable at all
                errors.append(e)
                break
            except NSQError as e:  # refused at the handshake (AUTH)
                raise PublishError(f"not published: {e}", 0, count, e) from e
            try:
                self._sending(conn.address, "sent")
                self._wait(self._send(conn, command), self._left(timeout), conn)
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
                self._wait(self._send(conn, command), self._left(timeout), conn)
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

    def _wait(self, fut: Future, timeout: float, conn: Connection | None, what: str = "",
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
                raise _refusal(i + 1, n, max_msg)
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
        max_msg = self.config.max_msg_size
        lens = measure(bodies, max_msg)  # the batching takes these lengths: no second look
        if lens is None:  # not all plain bytes, or one empty or too big: refused before any is sent
            bodies = [_as_body(body, i + 1) for i, body in enumerate(bodies)]
            for i, body in enumerate(bodies):
                if not body or len(body) > max_msg:
                    raise _refusal(i + 1, len(body), max_msg)
            lens = list(map(len, bodies))
        if self.fanout:
            batches = self.batches(bodies, batch_size)
            for b in batches:
                self._sync_fanout(encode_mpub(topic, b), len(b), timeout)
            return PublishResult(len(bodies), len(batches), list(self.addresses))
        return _IterPublish(self, topic, batch_size, window, timeout, None, None).run([bodies], lens)

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
        validate_topic(topic)
        return _IterPublish(self, topic, batch_size, window, timeout, rate, on_progress,
                            retries, retry_backoff, stop).run(bodies)

    def publish_framed(self, frames: Iterable[Framed], *, window: int = 8, timeout: float = 30.0,
                       rate: float | None = None, on_progress: Callable[[int], None] | None = None,
                       retries: int = 0, retry_backoff: float = 1.0, stop=None,
                       retry_for: float | None = None) -> PublishResult:
        """publish_iter for batches already encoded (:class:`Framed`, any topics): the same
        window, pacing, failover, splitting, retries and exact acknowledged count.

        ``retry_for`` (seconds) replaces ``retries`` with a time budget: once every address
        failed, go round them again (pauses from ``retry_backoff`` doubling, at most
        RETRY_PAUSE_MAX) until that long has passed since the first failure after the last OK."""
        run = _IterPublish(self, "", 0, window, timeout, rate, on_progress, retries, retry_backoff, stop)
        run.retry_for = retry_for
        return run.run_framed(frames)

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


class _Flush:
    __slots__ = ()

    def __repr__(self) -> str:
        return "FLUSH"


#: yielded by a publish_iter source between bodies: the batch taken so far is sent now, not
#: when it is full (a source that waited long enough for more: ``mpub --linger``)
FLUSH = _Flush()


class Stopped(Exception):
    """publish_iter's ``stop`` event was set: the source was not read further."""

    def __init__(self):
        super().__init__("stopped")


#: nsqd refused a batch as too big (E_BAD_BODY: over --max-body-size; E_BAD_MESSAGE: one of its
#: messages over --max-msg-size): split it and send the halves
TOO_BIG = ("E_BAD_BODY", "E_BAD_MESSAGE")


def _answered(entry: Entry) -> bool:
    return entry.future is not None and entry.future.done()


#: the longest pause between rounds over the addresses under a ``retry_for`` budget: an nsqd
#: back after a restart is found within this long
RETRY_PAUSE_MAX = 5.0

#: after a stop, how long the answers in flight may take in all before they count as unanswered
STOP_GRACE = 1.0


def _written(entries) -> list[Entry]:
    """The sent entries nsqd may hold without their OK having been counted: no answer yet, an
    OK not yet taken, or a connection lost after they were written. Not: never sent, certainly
    not processed (closed before nsqd read it), refused by nsqd - nor anything sent after a
    refusal (nsqd's errors to a publish are fatal: it reads nothing more on that connection, and
    every sent entry is on one connection)."""
    out = []
    for entry in entries:
        fut = entry.future
        if fut is None:
            continue
        if fut.done():
            err = fut._error
            if isinstance(err, ServerError):
                break
            if err is not None and getattr(err, "not_processed", False) is True:
                continue
        out.append(entry)
    return out


def _as_body(body, number: int) -> bytes:
    """Message ``number`` as the bytes nsqd gets: a str as UTF-8, bytes-like as bytes; anything
    else is refused (bytes(5) would be five zero bytes)."""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise LocalProtocolError(f"message {number} must be bytes or str, got {type(body).__name__}")


def _refusal(number: int, size: int, max_msg: int) -> LocalProtocolError:
    """Why message ``number``, of ``size`` bytes (empty or over ``max_msg``), is not sent."""
    why = "is empty" if not size else f"is {size} bytes, over the {max_msg}-byte max message size"
    return LocalProtocolError(f"message {number} {why}")


def measure(bodies: list, max_msg: int) -> list[int] | None:
    """The lengths of ``bodies`` when every one is non-empty ``bytes`` of at most ``max_msg``
    bytes (C-level passes: a set of types, a list of lengths, min and max), else None."""
    if set(map(type, bodies)) != {bytes}:
        return None
    lens = list(map(len, bodies))
    if not min(lens) or max(lens) > max_msg:
        return None
    return lens


class _IterPublish:
    """The state of one publish_iter / publish_framed call: a :class:`Ledger` of the batches
    taken from the source, driven through a window of futures (see Producer.publish_iter)."""

    def __init__(self, producer: Producer, topic: str, batch_size: int, window: int,
                 timeout: float, rate: float | None, on_progress, retries: int = 0,
                 retry_backoff: float = 1.0, stop=None):
        self.p = producer
        self.topic = topic
        if rate:
            cap = max(1, int(rate / 20))  # a batch is at most 50 ms of the rate
            batch_size = min(batch_size or cap, cap)
        self.batch_size = batch_size
        self.window = max(1, window)
        self.timeout = timeout
        self.on_progress = on_progress
        self.ledger = Ledger()
        self.body_limit = producer.config.max_body_size  # lowered when nsqd refuses a size
        self.failovers = 0
        self.addresses: list[str] = []
        self.pacer = Pacer(rate) if rate else None
        self.retries_left = max(0, retries)
        self.retry_backoff = retry_backoff
        self.retried = 0
        self.retry_for: float | None = None  # a time budget instead of ``retries`` (publish_framed)
        self.outage: tuple[float, int] | None = None  # (since, self.retried then): every address failing
        self.stop = stop
        self.source_error: BaseException | None = None
        #: messages [acked, maybe_end) may be held by some nsqd without its OK having come:
        #: written to a connection that was lost (or stalled, or timed out) before the answer
        self.maybe_end = 0
        self.resent = 0  # messages sent again after such a loss: possible duplicates
        self._sent = 0  # entries of the ledger (from the head) that are sent, all on _conn
        self._conn: Connection | None = None

    def run(self, bodies: Iterable[bytes], first_lens: list[int] | None = None) -> PublishResult:
        """``first_lens``: the lengths of the first item, a list already :func:`measure`d."""
        return self._drive(self._batches(bodies, first_lens))

    def run_framed(self, frames: Iterable[Framed]) -> PublishResult:
        return self._drive(self._counted(frames))

    # -- the source -----------------------------------------------------------------------------
    def _batches(self, bodies: Iterable[bytes], first_lens: list[int] | None = None):
        """(batch, count, nbytes, topic, lengths) of the caller's bodies, under the body limit.
        An error of the iterable (or a bad body) ends the batches, keeping what came before
        (the last partial batch still goes out).

        The source may yield a ``list`` of bodies for several at once (mpub yields each chunk
        it reads that way): a list of good ``bytes`` is measured once (:func:`measure`, C-level
        passes) and cut into batches by slicing, and the lengths go with each batch to its
        framing; a list holding a bad, big or odd body goes body by body."""
        max_msg, batch_size = self.p.config.max_msg_size, self.batch_size or (1 << 62)
        topic = self.topic
        cur: list[bytes] = []
        lens: list[int] = []
        size = 4
        taken = 0
        try:
            for item in bodies:  # hot loop: locals only
                if type(item) is list:
                    item_lens, first_lens = first_lens or measure(item, max_msg), None
                    i, end = 0, len(item)
                    while item_lens is not None and i < end:  # whole slices while they fit
                        if len(cur) >= batch_size:  # filled one by one before
                            yield cur, len(cur), size, topic, lens
                            cur, lens, size = [], [], 4
                        k = min(end - i, batch_size - len(cur))
                        whole = not i and k == end
                        head_lens = item_lens if whole else item_lens[i:i + k]
                        nb = 4 * k + sum(head_lens)
                        if size + nb > self.body_limit:
                            break
                        cur += item if whole else item[i:i + k]
                        lens += head_lens
                        size += nb
                        taken += k
                        i += k
                        if len(cur) >= batch_size:  # full: out now, not when the next item comes
                            yield cur, len(cur), size, topic, lens
                            cur, lens, size = [], [], 4
                    if i == end:
                        continue
                    item = item[i:]
                elif item is FLUSH:  # the source has nothing more for now: send what there is
                    if cur:
                        yield cur, len(cur), size, topic, lens
                        cur, lens, size = [], [], 4
                    continue
                else:
                    item = (item,)
                for body in item:  # one by one (the rest of a list holding a bad, big or odd body)
                    if type(body) is not bytes:
                        body = _as_body(body, taken + 1)
                    n = len(body)
                    if n == 0 or n > max_msg:
                        raise _refusal(taken + 1, n, max_msg)
                    if size + 4 + n > self.body_limit or len(cur) >= batch_size:
                        if cur:
                            yield cur, len(cur), size, topic, lens
                        cur, lens, size = [], [], 4
                    cur.append(body)
                    lens.append(n)
                    size += 4 + n
                    taken += 1
        except GeneratorExit:  # closed by _drive after a send failed
            raise
        except BaseException as e:  # the iterable failed (or a signal): what came before still goes out
            self.source_error = e
        if cur:
            yield cur, len(cur), size, topic, lens

    def _counted(self, frames: Iterable[Framed]):
        try:
            for frame in frames:
                yield frame, frame.count, len(frame.payload) + 4, frame.topic, None
        except GeneratorExit:
            raise
        except BaseException as e:  # building the frames failed: what came before still goes out
            self.source_error = e

    # -- driving ---------------------------------------------------------------------------------
    def _drive(self, batches) -> PublishResult:
        """Send every batch (windowed, paced), settle them all; on any failure raise
        PublishError with the exact acknowledged count."""
        self.p.publishing = self
        stop = self.stop
        try:
            for batch, count, nbytes, topic, lens in batches:
                if self.pacer is not None:
                    self.pacer.wait(count)
                ledger = self.ledger
                ledger.take(batch, count, nbytes, topic, lens)
                self._fill()
                while ledger.entries and (len(ledger) >= self.window or _answered(ledger.entries[0])):
                    self._settle_head()  # answered ones at once: progress is not held back
                if stop is not None and stop.is_set():
                    raise Stopped()
            while self.ledger.entries:
                self._settle_head()
        except BaseException as e:
            batches.close()
            self._fail(e)
        if self.source_error is not None:
            self._fail(self.source_error)
        self.p.publishing = None
        return PublishResult(self.ledger.acked, self.ledger.batches, self.addresses, self.retried, self.resent)

    def _fill(self) -> None:
        """Send the entries not sent yet, in order, up to ``window`` in flight (a new batch, or
        the first ``window`` after a failover or a split: a re-split ledger can hold hundreds).
        Every unsettled entry is on one connection: when that one is
        gone, nothing is sent on its replacement until the head's failure resends them all
        (otherwise a later batch could be published there before an earlier one, and then
        again with the resend)."""
        entries = self.ledger.entries
        while self._sent < len(entries) and self._sent < self.window:
            entry = entries[self._sent]
            conn = self._link()
            if self._sent and conn is not self._conn:
                return
            self._conn = conn
            if conn.address not in self.addresses:
                self.addresses.append(conn.address)
            entry.future = fut = Future()  # before the write: a send is never untracked
            entry.address = conn.address
            try:
                conn.send(entry.command(), fut)
            except TransportError as e:
                fut.set_exception(e)
            self._sent += 1

    def _settle_head(self) -> None:
        """Wait for the oldest batch's answer and act on it."""
        entry = self.ledger.head()
        if entry.future is None:
            self._fill()
        try:
            self._wait(entry)
        except ServerError as e:
            if e.code in TOO_BIG:
                self._split(entry, e)
            elif e.code in RETRIABLE:
                self._failover(e)
            else:
                raise
        except Timeout:  # no answer: nsqd may have published it; sending it again may duplicate it
            raise
        except TransportError as e:  # lost or not processed: nsqd may have it, or certainly not
            self._failover(e)
        else:
            self.ledger.ack_head()
            self._sent -= 1
            self.failovers = 0
            self.outage = None
            if self.on_progress is not None:
                self.on_progress(self.ledger.acked)
            if self._sent < len(self.ledger):
                self._fill()

    def _wait(self, entry: Entry) -> None:
        self.p._wait(entry.future, self.timeout, self._conn, f" to messages {entry.start + 1}-"
                     f"{entry.start + entry.count}: they may or may not be published", self.stop)

    # -- what nsqd may hold without having said so -------------------------------------------
    def unanswered(self) -> int:
        """Messages after the acknowledged ones that some nsqd may hold: written to it, and
        neither acknowledged nor certainly refused (no answer yet, or the connection was lost
        before it). At any moment, without waiting (a forced exit reports it)."""
        end = self.maybe_end
        for entry in _written(list(self.ledger.entries)):
            end = max(end, entry.start + entry.count)
        return max(0, end - self.ledger.acked)

    def _note_unanswered(self, grace: float = 0.0) -> int:
        """Remember the sent batches nsqd may hold (their connection is gone or given up on);
        returns how many messages they are. ``grace``: seconds to let the futures of a lost
        connection settle (it resolves them all as it closes) before they are judged."""
        end = time.monotonic() + grace
        if grace:
            for entry in self.ledger.entries:
                if entry.future is not None and not entry.future.done():
                    entry.future.wait(max(0.0, end - time.monotonic()))
        count = 0
        for entry in _written(self.ledger.entries):
            self.maybe_end = max(self.maybe_end, entry.start + entry.count)
            count += entry.count
        return count

    def _split(self, entry: Entry, error: ServerError) -> None:
        """nsqd refused the head batch as too big (and closed the connection, so nothing after
        it was processed): split it, learn the smaller body limit, send everything again."""
        if entry.count < 2:
            error.index = entry.start + 1
            ledger = self.ledger
            raise PublishError(f"published {ledger.acked} of {ledger.taken} messages: message {entry.start + 1} "
                               f"({len(entry.bodies()[0])} bytes) refused by nsqd: {error}",
                               ledger.acked, ledger.outstanding, error)
        if error.code == "E_BAD_BODY":
            self.body_limit = min(self.body_limit, max(8, entry.nbytes // 2))
        self.ledger.split_head()
        self.ledger.unsend_all()
        self.ledger.refit(self.body_limit)
        self._sent = 0
        self._fill()

    def _failover(self, error: BaseException) -> None:
        """The head batch got no OK: send it and everything after it again on the next nsqd.
        After a lost connection the batches it may have published are counted as resent
        (possible duplicates); after nsqd's E_*_FAILED (fatal: nothing after it was read) none."""
        maybe = self._note_unanswered(grace=1.0) if isinstance(error, TransportError) else 0
        if self.failovers >= len(self.p.addresses) - 1:
            self._retry_pause(error)
        else:
            self.failovers += 1
        self.resent += maybe
        self.p._current = (self.p._current + 1) % len(self.p.addresses)
        self.ledger.unsend_all()
        self._sent = 0
        self._fill()

    def _retry_pause(self, error: BaseException) -> None:
        """Every address failed: wait and go round again, or re-raise when no retry is left."""
        if self.retry_for is not None:
            now = time.monotonic()
            if self.outage is None:
                self.outage = (now, self.retried)
            left = self.outage[0] + self.retry_for - now
            if left <= 0:
                raise error
            pause = min(left, RETRY_PAUSE_MAX, self.retry_backoff * (2 ** (self.retried - self.outage[1])))
        else:
            if self.retries_left <= 0:
                raise error
            self.retries_left -= 1
            pause = min(30.0, self.retry_backoff * (2 ** self.retried))
        if self.stop is None:
            time.sleep(pause)
        elif self.stop.wait(pause):
            raise Stopped()
        self.retried += 1
        self.failovers = 0

    def _link(self) -> Connection:
        while True:
            try:
                return self.p._active_link()
            except TransportError as e:
                self._retry_pause(e)

    def _fail(self, e: BaseException) -> None:
        """Settle what is in flight (OKs count, in order, until the first failure), then raise
        PublishError with the exact acknowledged count, and (``unanswered``) how many messages
        after those some nsqd may hold all the same, and (``resent``) how many were sent again
        after a lost connection. After a stop (a signal, a deadline) the answers in flight get
        STOP_GRACE seconds in all: a stalled nsqd does not hold the stop for its timeout."""
        ledger = self.ledger
        stopping = isinstance(e, Stopped) or not isinstance(e, Exception)
        grace = STOP_GRACE
        if self.p.deadline is not None:  # a stop at the deadline (or near it) does not outlast it by much
            grace = min(grace, max(0.1, self.p.deadline - time.monotonic()))
        end = time.monotonic() + (grace if stopping else 0.0)
        try:
            while ledger.entries and ledger.head().future is not None:
                wait = max(0.0, end - time.monotonic()) if stopping else self.timeout
                ledger.head().future.result(wait)
                ledger.ack_head()
                if self.on_progress is not None:
                    self.on_progress(ledger.acked)
        except BaseException:
            pass
        self._note_unanswered()
        self.p.publishing = None
        unanswered = max(0, self.maybe_end - ledger.acked)
        if isinstance(e, PublishError):
            e.published, e.failed = ledger.acked, ledger.outstanding
            e.unanswered, e.resent = unanswered, self.resent
            raise e
        if isinstance(e, Stopped) or not isinstance(e, Exception):  # stop event, a signal, SystemExit
            message = f"interrupted: published {ledger.acked} of {ledger.taken} messages"
        else:
            message = f"published {ledger.acked} of {ledger.taken} messages before an error: {e}"
        if unanswered:
            message += (f" (messages {ledger.acked + 1}-{ledger.acked + unanswered} were written and got no "
                        "answer: nsqd may hold them)")
        err = PublishError(message, ledger.acked, ledger.outstanding, e)
        err.unanswered, err.resent = unanswered, self.resent
        raise err from e
