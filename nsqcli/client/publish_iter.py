"""publish_iter: many messages through one producer, in MPUB batches counted in one
:class:`~nsqcli.client.ledger.Ledger` (what nsqd acknowledged is always an exact prefix of what was
taken), up to a window of batches in flight, paced, failing over, splitting what nsqd refuses as
too big, retrying rounds over the addresses. See Producer.publish_iter for the user's contract.

:class:`IterPublish` works through a small interface of its producer (nsqcli.client.producer.Producer),
and nothing else of it:

- ``config`` (max_msg_size, max_body_size), ``deadline`` (time.monotonic(), or None) and
  ``addresses`` (how many nsqd there are to fail over to);
- ``connection()``: the connection to the current nsqd, failing over to the next reachable one
  (TransportError when none is);
- ``rotate()``: make the next address the current one;
- ``await_answer(future, timeout, conn, what, stop)``: nsqd's answer, Timeout (``conn`` dropped) when
  none came within ``timeout``, :class:`~nsqcli.client.future.Stopped` once ``stop`` is set.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .conn import Connection
from .future import Future, Stopped
from .ledger import Entry, Ledger
from .record import Record
from ..errors import LocalProtocolError, PublishError, ServerError, Timeout, TransportError
from ..protocol import encode_dpub, encode_mpub_framed, split_framed

#: nsqd errors after which the same batch may succeed later or elsewhere (nsqd exiting, disk)
RETRIABLE = ("E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED")


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


class Pacer:
    """Paces work at ``rate`` items per second from its creation: ``wait(n)`` returns when the
    n items' turn has come, so no second sees more than the rate plus one call's worth. Time the
    caller spent elsewhere (a stall, nsqd slow to answer) is not credit: the turns go on from
    the late call, not from the schedule it fell behind (Go's time.Tick drops ticks likewise)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.due = time.monotonic()  # when the items given so far have had their turn

    def wait(self, n: int) -> None:
        now = time.monotonic()
        self.due = max(self.due, now) + n / self.rate
        time.sleep(self.due - now)


class _Flush:
    __slots__ = ()

    def __repr__(self) -> str:
        return "FLUSH"


#: yielded by a publish_iter source between bodies: the batch taken so far is sent now, not
#: when it is full (a source that waited long enough for more: ``mpub --linger``)
FLUSH = _Flush()


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
            err = fut.exception()
            if isinstance(err, ServerError):
                break
            if err is not None and getattr(err, "not_processed", False) is True:
                continue
        out.append(entry)
    return out


def as_body(body, number: int) -> bytes:
    """Message ``number`` as the bytes nsqd gets: a str as UTF-8, bytes-like as bytes; anything
    else is refused (bytes(5) would be five zero bytes)."""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise LocalProtocolError(f"message {number} must be bytes or str, got {type(body).__name__}")


def refusal(number: int, size: int, max_msg: int) -> LocalProtocolError:
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


def checked_bodies(bodies: list, max_msg: int) -> tuple[list[bytes], list[int]]:
    """``bodies`` as bytes and their lengths (multi_publish); every one is checked before any
    is sent: LocalProtocolError names the first one empty, too big or not bytes/str."""
    if not bodies:
        raise LocalProtocolError("MPUB needs at least one message")
    lens = measure(bodies, max_msg)  # the batching takes these lengths: no second look
    if lens is None:  # not all plain bytes, or one empty or too big
        bodies = [as_body(body, i + 1) for i, body in enumerate(bodies)]
        for i, body in enumerate(bodies):
            if not body or len(body) > max_msg:
                raise refusal(i + 1, len(body), max_msg)
        lens = list(map(len, bodies))
    return bodies, lens


def batches(bodies: list[bytes], limit: int, max_msg: int, batch_size: int = 0) -> list[list[bytes]]:
    """``bodies`` split into MPUB batches whose body is at most ``limit`` bytes (and, if > 0,
    of at most ``batch_size`` messages). A single body over ``max_msg`` raises LocalProtocolError
    naming its index."""
    out: list[list[bytes]] = []
    cur: list[bytes] = []
    size = 4
    for i, body in enumerate(bodies):
        n = len(body)
        if n > max_msg:
            raise refusal(i + 1, n, max_msg)
        if cur and (size + 4 + n > limit or (batch_size and len(cur) >= batch_size)):
            out.append(cur)
            cur, size = [], 4
        cur.append(body)
        size += 4 + n
    if cur:
        out.append(cur)
    return out


class IterPublish:
    """The state of one publish_iter / publish_framed call: a :class:`Ledger` of the batches
    taken from the source, driven through a window of futures (see Producer.publish_iter).
    ``producer``: what it publishes through (the interface in this module's docstring)."""

    def __init__(self, producer, topic: str, batch_size: int, window: int,
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
        framing; a list holding a bad, big or odd body goes body by body.

        Longer than most functions on purpose: it is the loop every body passes through, kept
        on local variables in one frame (a helper per list or body costs a call each)."""
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
                        body = as_body(body, taken + 1)
                    n = len(body)
                    if n == 0 or n > max_msg:
                        raise refusal(taken + 1, n, max_msg)
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
        self.p.await_answer(entry.future, self.timeout, self._conn, f" to messages {entry.start + 1}-"
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
        self.p.rotate()
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
                return self.p.connection()
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

