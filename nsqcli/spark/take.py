"""One task of the nsq source, on an executor: take a share of a channel through the spool.

``take(settings, part)`` returns the partition's rows as Arrow record batches:

1. Slots already in the spool (a retry, a replayed batch, a faster speculative attempt) are
   read, not taken again; a partition with its END marker is returned as it is.
2. Otherwise the task subscribes to its nsqd and takes up to its share, in chunks of at most
   what nsqd lets one connection hold (``max_rdy_count``): each chunk is published to the spool
   (fsynced, atomically) and only then FINed. Losing a slot to another attempt means REQ and
   read the winner's chunk.
3. The partition ends (END marker) when its share is taken, when no message came for
   ``readIdleTimeout``, after ``maxReadTime``, or when a stop was asked (``.STOP`` in the batch);
   messages received beyond the share are REQed.

nsqd never sends more than RDY un-FINed messages, so a chunk is at most RDY and no message is
held longer than one chunk's fsync. After a kill -9 the messages of an unpublished chunk come
back from nsqd after msg_timeout; a published chunk is never taken again.

One window remains between publishing a chunk and nsqd receiving its FIN (a kill -9 at that
instant, an nsqd restart, a lost connection): nsqd then delivers those messages again, with
``attempts`` > 1. So a redelivered message is looked up in the spool (committed batches stay
there for ``retention``, longer than msg_timeout): one found there is FINed and dropped.
"""

from __future__ import annotations

import logging
import os
import time
from operator import attrgetter

from .plan import COLUMNS
from .spool import END, PartitionSpool

log = logging.getLogger("nsqcli.spark.source")

_body, _id, _timestamp, _attempts = (attrgetter(f) for f in ("body", "id", "timestamp", "attempts"))
CHUNK = 2500  # nsqd's default --max-rdy-count: one connection holds no more un-FINed
CHUNK_BYTES = 64 * 1024 * 1024       # a chunk closes at this many body bytes (Arrow's 2 GiB column limit)
PARTITION_BYTES = 256 * 1024 * 1024  # a task closes its partition here: the rest goes to later batches


def to_record_batch(msgs: list, nsqd: str, topic: str, channel: str):
    """Messages as an Arrow record batch in the source's schema (one C-level pass per column)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(msgs)
    ts = pa.array(list(map(_timestamp, msgs)), pa.int64())
    return pa.record_batch([
        pa.array(list(map(_body, msgs)), pa.binary()),
        pa.array(list(map(_id, msgs)), pa.binary()).cast(pa.string()),
        pc.divide(ts, 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.array(list(map(_attempts, msgs)), pa.int32()),
        pa.repeat(pa.scalar(nsqd, pa.string()), n),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(channel, pa.string()), n),
    ], names=list(COLUMNS))


def _redelivered(rb) -> int:
    """Rows of a spooled chunk that nsqd had delivered before (attempts > 1)."""
    import pyarrow.compute as pc

    return int(pc.sum(pc.greater(rb.column("attempts"), 1)).as_py() or 0)


def _ipc(batch) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> list:
    import pyarrow as pa

    return list(pa.ipc.open_stream(data))


class _Taker:
    """The task's one connection (opened only when the spool does not already hold the rows)."""

    def __init__(self, settings, part):
        from ..client.consumer import Consumer

        self.settings = settings
        cfg = settings.config.replace(max_in_flight=max(1, min(part.share, CHUNK)),
                                      max_in_flight_bytes=CHUNK_BYTES, touch_interval=5.0)
        self.consumer = Consumer(part.topic, settings.channel, pull=True, config=cfg,
                                 nsqd_tcp_addresses=[part.tcp],
                                 on_error=lambda e: log.warning("nsq source task: %s", e))
        self.consumer.start(fail_fast=True, deadline=time.monotonic() + settings.connect_timeout)

    def msg_timeout(self) -> float | None:
        """The msg_timeout nsqd granted (seconds): how long a lost FIN takes to come back."""
        got = self.consumer.msg_timeouts()
        return max(got) if got else None

    def gather(self, want: int, deadline: float, stopped, max_bytes: int = CHUNK_BYTES) -> list:
        """Up to ``want`` messages (and about ``max_bytes`` of bodies): stop at ``deadline``, after
        ``readIdleTimeout`` without one, or once ``stopped()`` (looked at every 0.2 s: a trickle
        fills a chunk slowly, and a quiet channel must not hold a stop for the idle time). What
        nsqd sent beyond stays queued for the next."""
        got: list = []
        size = 0
        idle = self.settings.read_idle
        last = time.monotonic()  # the last message (or the start)
        look = last + 0.2
        while len(got) < want and size < max_bytes:
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= look:
                if stopped():
                    break
                look = now + 0.2
            wait = max(0.0, min(0.2, idle - (now - last), deadline - now))
            msgs = self.consumer.poll(min(want - len(got), 256), timeout=wait)
            if not msgs:
                if time.monotonic() - last >= idle:
                    break
                continue
            last = time.monotonic()
            got += msgs
            size += sum(len(m.body) for m in msgs)
        return got

    def close(self) -> None:
        """CLS, then REQ whatever arrived beyond the share (nsqd would hold it until msg_timeout)."""
        c = self.consumer
        try:
            c.set_max_in_flight(0)
            c.drain(2.0)
            # a message read in the same recv as CLOSE_WAIT may reach the queue just after it
            rest = c.poll(1 << 30, timeout=0.02)
            while rest:
                c.requeue_many(rest, 0.0)
                rest = c.poll(1 << 30, timeout=0.02)
        finally:
            c.stop(2.0)


_spooled: dict = {}  # (root, epoch) -> {batch: (files indexed, {"nsqd/topic/id"})}; workers are reused


def already_spooled(root: str, epoch: str, msgs: list, nsqd: str, topic: str) -> list:
    """The messages among ``msgs`` (redeliveries) that a spool chunk of this query holds. nsqd's
    ids are unique per topic only (time + sequence), so the key is nsqd/topic/id."""
    import pyarrow as pa

    from .spool import batches_on_disk

    cache = _spooled.setdefault((root, epoch), {})
    on_disk = batches_on_disk(root, epoch)
    for gone in set(cache) - set(on_disk):  # deleted by the driver: forget them
        del cache[gone]
    for b in on_disk:
        files, ids = cache.setdefault(b, (set(), set()))
        d = os.path.join(root, epoch, str(b))
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for n in names:
            path = os.path.join(d, n)
            if n.startswith(".") or path in files:
                continue
            try:
                with pa.memory_map(path) as src:
                    if src.read(1) != b"{":
                        src.seek(0)
                        for rb in pa.ipc.open_stream(src):
                            if rb.num_rows:
                                key = f"{rb.column('nsqd')[0].as_py()}/{rb.column('topic')[0].as_py()}/"
                                ids.update(key + i for i in rb.column("id").to_pylist())
                files.add(path)
            except (OSError, pa.ArrowInvalid):
                continue
    known = set().union(*(ids for _, ids in cache.values())) if cache else set()
    key = f"{nsqd}/{topic}/"
    return [m for m in msgs if key + m.id.decode() in known]


def _not_spooled(settings, epoch: str, part, taker, msgs: list) -> list:
    """``msgs`` without the redelivered ones a spool chunk already holds (spooled before, their FIN
    lost): those are FINed now, never twice in the output."""
    again = [m for m in msgs if m.attempts > 1]
    if not again:
        return msgs
    dup = already_spooled(settings.spool, epoch, again, part.tcp, part.topic)
    if not dup:
        return msgs
    log.warning("nsq source task: %d redelivered message(s) were already spooled "
                "(a FIN was lost): FINed, not taken again", len(dup))
    taker.consumer.finish_many(dup)
    dropped = {id(m) for m in dup}
    return [m for m in msgs if id(m) not in dropped]


def _finish(taker, msgs: list, left: int) -> None:
    """A chunk is in the spool: RDY down to what is left of the share, then FIN it."""
    taker.consumer.set_max_in_flight(max(0, min(left, CHUNK)))
    lost = taker.consumer.finish_many(msgs)
    if lost:
        log.warning("nsq source task: %d FIN(s) could not be sent (connection lost): nsqd "
                    "will deliver those spooled messages again", len(lost))


def take(settings, part, epoch: str, batch: int, index: int):
    """Yield the partition's record batches, each once it is in the spool (see the module
    docstring): Spark writes one chunk while the task takes the next."""
    # one loop over the spool's slots (read one, or take, publish, FIN and yield a chunk): kept whole
    spool = PartitionSpool(settings.spool, epoch, batch, index)
    started = time.monotonic()
    deadline = started + settings.max_read_time
    rows, size, oldest, slot, again_n = 0, 0, None, 0, 0
    taker: _Taker | None = None
    try:
        while True:
            state = spool.read(slot)
            if state is not None:
                kind, value = state
                if kind == END:
                    return
                for rb in _from_ipc(value):
                    rows += rb.num_rows
                    size += rb.nbytes
                    again_n += _redelivered(rb)
                    yield rb
                slot += 1
                continue
            want = min(part.share - rows, CHUNK)
            msgs: list = []
            if want > 0 and size < PARTITION_BYTES and time.monotonic() < deadline and not spool.stop_requested():
                if taker is None:
                    taker = _Taker(settings, part)
                got = taker.gather(want, deadline, spool.stop_requested)
                msgs = _not_spooled(settings, epoch, part, taker, got)
                if got and not msgs:
                    continue
            if not msgs:  # share taken, nothing more came, or out of time: close the partition
                if spool.end(slot, {"index": index, "rows": rows, "share": part.share, "oldest_ns": oldest,
                                      "redelivered": again_n, "msg_timeout": taker.msg_timeout() if taker else None, "pid": os.getpid(),
                                      "spooled_ns": time.time_ns(),
                                      "seconds": round(time.monotonic() - started, 3)}):
                    return
                continue  # another attempt closed or filled this slot first: read it
            try:
                rb = to_record_batch(msgs, part.tcp, part.topic, settings.channel)
                won = spool.publish(slot, _ipc(rb))
            except BaseException:  # a full disk, a zombie whose spool was deleted...: give them back
                taker.consumer.requeue_many(msgs, 0.0)
                raise
            if won:
                _finish(taker, msgs, part.share - rows - len(msgs))
                first = min(m.timestamp for m in msgs)
                oldest = first if oldest is None else min(oldest, first)
                rows += len(msgs)
                size += rb.nbytes
                again_n += sum(1 for m in msgs if m.attempts > 1)
                slot += 1
                yield rb
            else:
                taker.consumer.requeue_many(msgs, 0.0)
    finally:
        if taker is not None:
            try:
                taker.close()
            except Exception as e:  # nsqd redelivers what was not answered
                log.warning("nsq source task: closing: %s", e)
