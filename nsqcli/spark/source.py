"""The nsq streaming source: ``spark.readStream.format("nsq")``.

NSQ has no offsets and nsqd tracks in-flight messages per connection, so all NSQ I/O lives in the
one long-lived process Spark runs per query on the driver (the "stream reader runner"): held-batch
consumers (``Consumer(pull=True)``) subscribe there, lazily on the first offset request (never in
``__init__``: Spark also builds this reader in its planner and pickles that copy to executors).

- Offsets are ``{"seq": n}``: a synthetic sequence numbering the messages handed to Spark. A
  fresh runner starts it at the current time in microseconds, so a restarted query never sees its
  offsets go backwards, whatever it checkpointed.
- ``latestOffset`` takes what the consumers hold (up to the read limit), numbers it, and returns
  the new end. ``partitions(start, end)`` packs those messages into Arrow record batches inside
  the partitions, so executors never talk to nsqd.
- A message is FINed only once the batch holding it is durable in the sink: in ``commit(end)``
  and, on Spark >= 4.2, as soon as ``latestOffset(start)`` is called (the engine runs one batch at
  a time and asks for the next offset only after the previous batch's commit log was written).
- Held messages are TOUCHed (every ``touchInterval``, at most half the msg_timeout nsqd
  negotiated); a warning is logged when one nears nsqd's max_msg_timeout, after which nsqd
  redelivers it anyway.
- Delivery is at least once: after a crash nsqd redelivers what was not FINed (once msg_timeout
  passes), with the same ``id``; (``nsqd``, ``id``) is the dedupe key.
- ``trigger(availableNow=True)`` (Spark >= 4.2): drain what was published before the query
  started (by nsqd's timestamp), stop when no such message arrived for ``availableNowIdleTimeout``;
  newer messages are given back (REQ) untouched by the query.
"""

from __future__ import annotations

import logging
import math
import time
from operator import attrgetter

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
    _BASES: tuple = (DataSourceStreamReader, SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadMaxRows = None
    _BASES = (DataSourceStreamReader,)

from . import options as opt

log = logging.getLogger("nsqcli.spark.source")

SCHEMA = ("body binary, id string, timestamp timestamp, attempts int, nsqd string, "
          "topic string, channel string")
COLUMNS = ("body", "id", "timestamp", "attempts", "nsqd", "topic", "channel")
_body, _id, _timestamp, _attempts = (attrgetter(f) for f in ("body", "id", "timestamp", "attempts"))
# per task. Small tasks cost: 768 KiB parts (under Spark's 1000 KiB "large task" warning) ran
# 62k msg/s into Parquet where 8 MiB parts ran 103k (bench.spark, 100k-message batches)
PARTITION_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_RDY = 2500
DEFAULT_MAX_IN_FLIGHT = 20000  # 8 connections per nsqd at nsqd's default --max-rdy-count
LINGER = 0.05  # a batch takes what arrives until the stream pauses this long (or it is full)   # nsqd's default --max-rdy-count: more in flight needs more connections


class NSQPartition(InputPartition):
    """One task's rows, already an Arrow record batch (pickled to the executor)."""

    def __init__(self, batch):
        super().__init__(None)
        self.batch = batch


def to_record_batch(msgs: list, bodies: list | None = None):
    """Messages (all from one topic and nsqd) as an Arrow record batch in the source's schema
    (columnar: one C-level pass per field, no per-row Python objects built)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(msgs)
    handle = msgs[0].responder
    ts = pa.array(list(map(_timestamp, msgs)), pa.int64())
    return pa.record_batch([
        pa.array(bodies if bodies is not None else list(map(_body, msgs)), pa.binary()),
        pa.array(list(map(_id, msgs)), pa.binary()).cast(pa.string()),
        pc.divide(ts, 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.array(list(map(_attempts, msgs)), pa.int32()),
        pa.repeat(pa.scalar(handle.address, pa.string()), n),
        pa.repeat(pa.scalar(handle.topic, pa.string()), n),
        pa.repeat(pa.scalar(handle.channel, pa.string()), n),
    ], names=list(COLUMNS))


def split_by_node(msgs: list, max_bytes: int) -> list[tuple[list, list]]:
    """(messages, bodies) parts: one topic and nsqd each, at most ~max_bytes of bodies."""
    by_handle: dict = {}
    for m in msgs:  # one attribute read per message; a node may have several connections
        by_handle.setdefault(m.responder, []).append(m)
    groups: dict = {}
    for handle, ms in by_handle.items():
        groups.setdefault((handle.topic, handle.address), []).extend(ms)
    parts = []
    for group in groups.values():
        bodies = list(map(_body, group))
        size = sum(map(len, bodies)) + 64 * len(group)
        k = max(1, math.ceil(size / max_bytes))
        step = math.ceil(len(group) / k)
        parts += [(group[i:i + step], bodies[i:i + step]) for i in range(0, len(group), step)]
    return parts


def _by_consumer(msgs: list) -> list[tuple]:
    """[(consumer, its messages)]: answers go through the consumer that received them."""
    groups: dict = {}
    for m in msgs:
        consumer = m.responder.consumer
        groups.setdefault(id(consumer), (consumer, []))[1].append(m)
    return list(groups.values())


class _Live:
    """The runner's connections and ledger (never pickled, never built in the planner)."""

    def __init__(self, reader: "NSQStreamReader"):
        from ..client.consumer import Consumer

        self.reader = reader
        self.next_seq = self.initial = time.time_ns() // 1000
        self.buffer: list = []        # received, not yet handed to Spark
        self.later: list = []         # AvailableNow: published after the query started
        self.chunks: list = []        # [lo, hi, msgs]: handed to Spark, not FINed yet
        self.planned_end: int | None = None
        self.finished = False
        r = reader
        per = max(1, math.ceil(r.max_in_flight / r.connections))
        cfg = r.config.with_(max_in_flight=per, touch_interval=r.touch_interval)
        self.consumers = []
        try:
            for topic in r.topics:
                for _ in range(r.connections):
                    c = Consumer(topic, r.channel, pull=True, config=cfg, nsqd_tcp_addresses=r.nsqd,
                                 lookupd_http_addresses=r.lookupd,
                                 on_error=lambda e: log.warning("nsq source: %s", e))
                    self.consumers.append(c)
                    c.start(fail_fast=True, deadline=time.monotonic() + r.connect_timeout)
        except BaseException:
            self.close(0.5)
            raise

    # -- receiving ---------------------------------------------------------------------------
    def fill(self, want: int, wait: float, until_ns: int | None) -> None:
        """Take every message the consumers have into the buffer (held there, they are TOUCHed;
        left in the consumers they would time out). Until ``want`` are buffered, keep taking
        what follows within LINGER; with ``wait`` > 0, wait that long for the first (then gaps up
        to 0.2 s). AvailableNow: messages newer than ``until_ns`` go aside, not this query's."""
        deadline = time.monotonic() + wait
        while True:
            got = 0
            for c in self.consumers:
                for m in c.poll(self.reader.max_in_flight, timeout=0):
                    if until_ns is not None and m.timestamp > until_ns:
                        self.later.append(m)
                    else:
                        self.buffer.append(m)
                        got += 1
            if len(self.buffer) >= want:
                return
            now = time.monotonic()
            if got:  # linger while messages keep coming: fuller batches, fewer of them
                deadline = min(deadline, now + 0.2) if wait else now + LINGER
                continue
            if now >= deadline:
                return
            time.sleep(0.01)

    def hand(self, start: int, limit: int | None) -> int:
        """Number buffered messages from ``next_seq`` (not past ``start + limit``); the new end."""
        # number on from the batch end Spark checkpointed (or from what is handed beyond it)
        self.next_seq = max([start] + [hi for _, hi, _ in self.chunks])
        room = len(self.buffer) if limit is None else max(0, start + limit - self.next_seq)
        take, self.buffer = self.buffer[:room], self.buffer[room:]
        if take:
            lo = self.next_seq
            self.chunks.append([lo, lo + len(take), take])
            self.next_seq += len(take)
        return self.next_seq if limit is None else min(self.next_seq, start + limit)

    # -- answering ---------------------------------------------------------------------------
    def finish_upto(self, end: int) -> int:
        """FIN every handed message numbered below ``end``; returns how many."""
        done, keep = [], []
        for lo, hi, msgs in self.chunks:
            if hi <= end:
                done += msgs
            elif lo < end:
                done += msgs[:end - lo]
                keep.append([end, hi, msgs[end - lo:]])
            else:
                keep.append([lo, hi, msgs])
        self.chunks = keep
        if done:
            lost = sum(len(consumer.finish_many(ms)) for consumer, ms in _by_consumer(done))
            if lost:
                log.warning("nsq source: %d FIN(s) could not be sent (connection lost): nsqd will "
                            "deliver those messages again", lost)
        return len(done)

    def messages(self, start: int, end: int) -> list:
        out = []
        for lo, hi, msgs in self.chunks:
            if hi > start and lo < end:
                out += msgs[max(0, start - lo):min(hi, end) - lo]
        return out

    def give_back(self, msgs: list) -> None:
        for consumer, ms in _by_consumer(msgs):
            consumer.requeue_many(ms, 0.0)

    def stop_and_give_back(self) -> None:
        """CLS first (a message requeued while RDY is up would come straight back to us), then
        REQ everything received and not handed to Spark, then close."""
        for c in self.consumers:
            c.drain(5.0)
        rest, self.buffer, self.later = self.buffer + self.later, [], []
        for c in self.consumers:
            rest += c.poll(1 << 30, timeout=0)
        if rest:
            self.give_back(rest)
        self.close(5.0)

    def close(self, timeout: float) -> None:
        for c in self.consumers:
            try:
                c.stop(timeout)
            except Exception as e:  # closing is best effort: nsqd redelivers what is in flight
                log.warning("nsq source: closing a consumer: %s", e)


class NSQStreamReader(*_BASES):
    def __init__(self, options, schema=None):
        self.topics = opt.topics(options, "topic")
        self.channel = opt.channel(options)
        self.nsqd, self.lookupd = opt.endpoints(options)
        # nsqd sends no more than maxInFlight un-FINed messages and a batch is FINed only after
        # its commit, so batches stay at half of it: the next one fills while one runs
        per_batch = opt.number(options, "maxMessagesPerBatch", None, minimum=1)
        self.max_in_flight = opt.number(options, "maxInFlight", max(DEFAULT_MAX_IN_FLIGHT, 2 * (per_batch or 0)),
                                        minimum=1)
        self.max_per_batch = per_batch or max(1, self.max_in_flight // 2)
        self.connections = opt.number(options, "connectionsPerNsqd",
                                      max(1, math.ceil(self.max_in_flight / DEFAULT_MAX_RDY)), minimum=1)
        self.min_partitions = opt.number(options, "minPartitions", 2, minimum=1)
        self.partition_bytes = opt.number(options, "maxPartitionBytes", PARTITION_BYTES, minimum=1024)
        self.touch_interval = opt.seconds(options, "touchInterval") or 30.0
        self.idle = opt.seconds(options, "availableNowIdleTimeout") or 2.0
        self.connect_timeout = opt.seconds(options, "connectTimeout") or 15.0
        self.config = opt.config(options)
        if self.config.msg_timeout is not None and not 1.0 <= self.config.msg_timeout <= 900:
            raise opt.OptionError("option 'msgTimeout' must be between 1s and 15m")
        self._live: _Live | None = None
        self._until_ns: int | None = None   # AvailableNow: the query's "now"

    def __getstate__(self):  # the planner's copy goes to executors: never connections
        state = dict(self.__dict__)
        state["_live"] = None
        return state

    def _state(self) -> _Live:
        if self._live is None:
            self._live = _Live(self)
        return self._live

    # -- offsets ---------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        live = self._state()  # Spark may ask more than once: always the same answer
        return {"seq": live.initial}

    def getDefaultReadLimit(self):  # Spark >= 4.2 only
        return ReadMaxRows(self.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._until_ns = time.time_ns()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        live = self._state()
        if start is None:  # Spark 4.0/4.1: the last planned batch ended where this one starts
            begin = live.planned_end if live.planned_end is not None else live.next_seq
        else:
            begin = int(start["seq"])
        # the engine asks for a new offset only once the previous batch is durable in the sink
        live.finish_upto(begin)
        if live.finished:
            return {"seq": begin}
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        elif limit is None:  # Spark 4.0/4.1: no admission control, our own cap
            cap = self.max_per_batch
        else:  # ReadAllAvailable: the engine asks for everything (an AvailableNow batch)
            cap = None
        ahead = live.next_seq - begin  # handed before, not run yet (Spark asked again)
        want = (cap if cap is not None else self.max_in_flight) - max(0, ahead)
        draining = self._until_ns is not None
        live.fill(max(0, want), self.idle if draining and ahead <= 0 else 0.0, self._until_ns)
        end = live.hand(begin, cap)
        if draining and end == begin:  # AvailableNow: all that was there is durable: done
            self._finish(live)
        return {"seq": end}

    def _finish(self, live: _Live) -> None:
        """AvailableNow is done: everything handed out is FINed; give the rest back and close."""
        live.finished = True
        live.stop_and_give_back()

    # -- planning and reading ----------------------------------------------------------------
    def partitions(self, start: dict, end: dict):
        s, e = int(start["seq"]), int(end["seq"])
        if e <= s:
            return []
        live = self._state()
        live.next_seq = max(live.next_seq, e)
        live.planned_end = e
        msgs = live.messages(s, e)
        if not msgs:
            # re-run of a batch from before a restart: its messages died with the old
            # connections and come back from nsqd (same id) once their msg_timeout passes
            if e - s:
                log.warning("nsq source: batch (%d, %d] was planned by an earlier run; its %d messages "
                            "will be redelivered by nsqd", s, e, e - s)
            return []
        parts = split_by_node(msgs, self.partition_bytes)
        while len(parts) < self.min_partitions:
            parts.sort(key=lambda p: len(p[0]))
            ms, bs = parts.pop()
            if len(ms) < 2:
                parts.append((ms, bs))
                break
            half = len(ms) // 2
            parts += [(ms[:half], bs[:half]), (ms[half:], bs[half:])]
        return [NSQPartition(to_record_batch(ms, bs)) for ms, bs in parts]

    def read(self, partition):
        yield partition.batch

    def commit(self, end: dict) -> None:
        if self._live is not None:
            self._live.finish_upto(int(end["seq"]))

    def stop(self) -> None:  # Spark rarely calls it (the runner is killed); nsqd redelivers
        if self._live is not None:
            self._live.close(2.0)
