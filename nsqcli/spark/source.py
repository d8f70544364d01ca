"""The nsq streaming source: ``spark.readStream.format("nsq")``. Plan on the driver, read on the
executors, exactly once through a write-ahead spool.

- **Driver** (the one long-lived process Spark runs per query): ``latestOffset`` reads each
  nsqd's channel depth from ``/stats`` (nodes through nsqlookupd, or given) and plans the batch
  (plan.py): how many messages each partition takes from which nsqd. The plan is the batch's end
  offset, written to Spark's offset log before the batch runs. The driver does no per-message
  work and holds no NSQ connection.
- **Executors**: ``read(partition)`` subscribes to its nsqd and takes its share (take.py),
  publishing each chunk to the spool before FINing it (spool.py). A retried task or a batch
  replayed after a crash reads the spool, not nsqd: every batch is deterministic, so with
  Spark's exactly-once sinks (files, Delta, foreachBatch keyed by batch id) delivery is
  **exactly once end to end**, with no dedupe and no wait for msg_timeout.
- ``commit(end)`` (Spark: the batch is durable in the sink) deletes the spools up to it.
- Latency: a batch takes what the channel held when it was planned (at most
  ``maxMessagesPerBatch``), so it closes at its trigger; a task waits at most
  ``readIdleTimeout`` for a message that does not come, and never more than ``maxReadTime``.
- ``trigger(availableNow=True)``: the depths when the query starts are the target; batches take
  them (at most ``maxMessagesPerBatch`` each) and the query stops.
- Progress (``StreamingQueryProgress.sources[0]``): ``endOffset`` shows the plan and the depth
  it saw; ``latestOffset`` shows the channel depth, the rows the last batch spooled and the age
  of its oldest message.

Spark 4.2+ passes ``latestOffset`` the end of the last batch (``start``) and a read limit. Spark
4.0 and 4.1 call ``latestOffset()`` with nothing: the source then keeps the end of the last batch
Spark planned itself, from ``partitions(start, end)`` (compat.py).
``spoolLocation`` must be a path every executor reaches (local disk in local mode; a shared mount
on a cluster).
"""

from __future__ import annotations

import logging
import time
import uuid

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
    _BASES: tuple = (DataSourceStreamReader, SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadMaxRows = None
    _BASES = (DataSourceStreamReader,)

from . import plan as P
from . import spool
from .compat import Planned

log = logging.getLogger("nsqcli.spark.source")

SCHEMA, COLUMNS = P.SCHEMA, P.COLUMNS
UNREACHABLE = -1  # a depth: nsqd's /stats did not answer this time


class NSQPartition(InputPartition):
    """One task: take ``part.share`` messages of ``part.topic`` from nsqd ``part.tcp``."""

    def __init__(self, epoch: str, batch: int, index: int, part: P.Part):
        super().__init__(None)
        self.epoch, self.batch, self.index, self.part = epoch, batch, index, part


class _Nodes:
    """The driver's view of the cluster: targets (topic x nsqd) and their channel depth."""

    def __init__(self, s: P.SourceSettings):
        self.s = s
        self.info: dict[str, str] = {}     # nsqd HTTP address -> its TCP address (from /info)
        self.ready: set = set()            # (http, topic): channel created there
        self.pending: dict = {}            # target -> the topic's depth at the last read
        self.held: dict = {}               # target -> in flight + deferred at the last read
        self.warned: set = set()
        self.settled: set = set()         # targets whose depth was read settled once

    def targets(self) -> list[P.Target]:
        from ..client.http import cluster_view, http_json

        s, out = self.s, {}
        for http in s.nsqd_http:
            tcp = self.info.get(http)
            if tcp is None:
                try:
                    port = int((http_json(http, "/info", timeout=5.0) or {})["tcp_port"])
                except Exception as e:
                    self._warn(http, f"nsq source: {http}: cannot read /info ({e}); skipped this batch")
                    continue
                host = http.split("://", 1)[-1].rsplit(":", 1)[0]
                tcp = self.info[http] = f"{host}:{port}"
            for t in s.topics:
                out[(t, tcp)] = P.Target(t, tcp, http)
        if s.lookupd:
            for t in s.topics:
                view = cluster_view(s.lookupd, t, timeout=5.0)
                for e in view.errors:
                    self._warn(str(e), f"nsq source: {e}")
                for n in view.producers(t):
                    out.setdefault((t, n.tcp_address), P.Target(t, n.tcp_address, n.http_address))
        for tcp in s.nsqd:
            for t in s.topics:
                if not any(k[1] == tcp and k[0] == t for k in out):
                    out[(t, tcp)] = P.Target(t, tcp, None)
        return list(out.values())

    def depth(self, t: P.Target) -> int | None:
        """The channel's depth on that nsqd (creating the channel the first time, so the query
        gets every message published from its start); None if unknown (TCP address only)."""
        from ..client.http import http_json

        if t.http is None:
            return None
        try:
            if (t.http, t.topic) not in self.ready:
                # nsqd 1.3 answers TOPIC_NOT_FOUND to /channel/create before the topic exists
                http_json(t.http, "/topic/create", {"topic": t.topic}, timeout=5.0, method="POST")
                http_json(t.http, "/channel/create", {"topic": t.topic, "channel": self.s.channel},
                          timeout=5.0, method="POST")
                self.ready.add((t.http, t.topic))
            stats = http_json(t.http, "/stats", {"format": "json", "topic": t.topic, "channel": self.s.channel,
                                                 "include_clients": "false"}, timeout=5.0) or {}
        except Exception as e:
            self._warn(t.http, f"nsq source: {t.http}: {e}; nothing taken from it while it fails")
            return UNREACHABLE
        for topic in stats.get("topics") or []:
            if topic.get("topic_name") == t.topic:
                # the topic's own depth is what it has not copied to its channels yet (ours included)
                pending = int(topic.get("depth") or 0)
                self.pending[t] = pending
                for ch in topic.get("channels") or []:
                    if ch.get("channel_name") == self.s.channel:
                        self.held[t] = int(ch.get("in_flight_count") or 0) + int(ch.get("deferred_count") or 0)
                        return int(ch.get("depth") or 0) + pending
        # the channel is gone (deleted, or a restarted nsqd lost its data): make it again
        if (t.http, t.topic) in self.ready:
            self.ready.discard((t.http, t.topic))
            log.warning("nsq source: channel %s/%s is gone from %s: creating it again (what was published "
                        "to the topic meanwhile may not have reached it)", t.topic, self.s.channel, t.http)
        return 0

    def settled_depth(self, t: P.Target, timeout: float = 5.0) -> int | None:
        """The depth once the topic has copied what it holds to the channel (nsqd counts the
        topic and the channel at different moments, so while it copies - after the channel was
        created, under a burst - messages on their way count in neither); at most ``timeout``."""
        self.settled.add(t)
        d = self.depth(t)
        deadline = time.monotonic() + timeout
        while d not in (None, UNREACHABLE) and self.pending.get(t) and time.monotonic() < deadline:
            time.sleep(0.05)
            d = self.depth(t)
        return d

    def _warn(self, key: str, text: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            log.warning("%s", text)


class NSQStreamReader(*_BASES):
    def __init__(self, options, schema=None):
        self.s = P.SourceSettings(options)
        self._nodes: _Nodes | None = None   # driver runner only (never pickled)
        self._epoch: str | None = None
        self._target: dict | None = None    # AvailableNow: what is left to take per target
        self._counted = 0                   # AvailableNow: the last batch whose rows were counted
        self._warned_held = False
        self._available_now = False
        self._metrics: dict = {}
        self._planned = Planned(needed=ReadMaxRows is None)

    def __getstate__(self):  # the planner's copy goes to executors
        state = dict(self.__dict__)
        state["_nodes"] = None
        return state

    def _view(self) -> _Nodes:
        if self._nodes is None:
            self._nodes = _Nodes(self.s)
        return self._nodes

    # -- offsets (driver) ------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        if self._epoch is None:  # Spark may ask more than once: always the same answer
            self._epoch = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
            view = self._view()
            for t in view.targets():  # the channel exists from the query's start
                view.depth(t)
        return P.initial(self._epoch)

    def getDefaultReadLimit(self):  # Spark >= 4.2 only
        return ReadMaxRows(self.s.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        if start is None:  # Spark 4.0/4.1: where the last batch ended is ours to know
            start = self._planned.last(self._epoch) or self.initialOffset()
        epoch, batch, _ = P.parse(start)
        self._epoch = epoch
        view = self._view()
        # a target seen for the first time: its depth once the topic copied what it holds to the
        # channel (just created, under a burst), else the first batch misses what is on its way
        depths = [(t, view.depth(t) if t in view.settled else view.settled_depth(t)) for t in view.targets()]
        depths = [(t, d) for t, d in depths if d != UNREACHABLE]
        known = sum(d for _, d in depths if d)
        if self._available_now:
            depths = self._available_now_left(depths, epoch, batch, start)
        cap = limit.max_rows if ReadMaxRows is not None and isinstance(limit, ReadMaxRows) else self.s.max_per_batch
        parts = P.plan_batch(depths, cap, self.s.max_per_partition, self.s.min_partitions)
        self._metrics = {"channelDepth": known, "nsqdNodes": len({t.tcp for t, _ in depths})}
        self._metrics.update(self._last_batch(epoch, batch))
        if not parts:
            if self._available_now:
                held = sum(view.held.get(t, 0) for t, _ in depths)
                if held and not self._warned_held:
                    self._warned_held = True
                    log.warning("nsq source: AvailableNow is done, and %d message(s) are in flight to other "
                                "consumers or deferred at nsqd (a killed run's come back after msg_timeout): "
                                "a later run takes them", held)
            return start
        # the last batch's lateness rides in the new end offset too: Spark < 4.2 shows no
        # reportLatestOffset, every version shows endOffset (progress.sources[0])
        last = {k: v for k, v in self._metrics.items() if k.startswith("lastBatch")}
        last["plannedAtMs"] = int(time.time() * 1000)
        if self.s.planned_by:  # tells a batch run again after a crash from one this run planned
            last["plannedBy"] = self.s.planned_by
        return P.offset(epoch, batch + 1, parts, known, last)

    def _available_now_left(self, depths: list, epoch: str, batch: int, start: dict) -> list:
        """AvailableNow: what each target held when first seen is its target, less the rows each
        batch took (END markers); a target of unknown depth (TCP address only) is done once a
        task for it took less than its share. [(target, what to take now)]."""
        if self._target is None:
            self._target = {}
        if batch > self._counted:  # count the last batch once, by the rows its tasks spooled
            self._counted = batch
            _, _, last = P.parse(start)
            ends = {e.get("index"): e for e in spool.summaries(self.s.spool, epoch, batch)}
            for i, p in enumerate(last):
                t = next((t for t in self._target if t.topic == p.topic and t.tcp == p.tcp), None)
                if t is None:
                    continue
                rows = ends.get(i, {}).get("rows")
                if self._target[t] is None:
                    if rows is not None and rows < p.share:
                        self._target[t] = 0
                else:
                    self._target[t] -= p.share if rows is None else rows
        out = []
        for t, d in depths:
            if t not in self._target and d is not None:  # first seen: what it holds now, settled
                d = self._view().settled_depth(t)
                if d == UNREACHABLE:
                    continue
            left = self._target.setdefault(t, d)
            out.append((t, 0 if left == 0 else d if d is None or left is None else min(d, max(0, left))))
        return out

    def _last_batch(self, epoch: str, batch: int) -> dict:
        """Rows the last batch spooled and how old its oldest message was when it was spooled."""
        ends = spool.summaries(self.s.spool, epoch, batch)
        if not ends:
            return {}
        ages = [e["spooled_ns"] - e["oldest_ns"] for e in ends if e.get("oldest_ns") and e.get("spooled_ns")]
        return {"lastBatch": batch, "lastBatchSpooledRows": sum(int(e.get("rows") or 0) for e in ends),
                "lastBatchOldestMessageAgeMs": int(max(ages) / 1e6) if ages else None,
                "lastBatchRedelivered": sum(int(e.get("redelivered") or 0) for e in ends)}

    def reportLatestOffset(self) -> dict:  # Spark >= 4.2: shown as the source's latestOffset
        return {"v": 2, "epoch": self._epoch, **self._metrics}

    # -- planning (driver) and reading (executors) -------------------------------------------------
    def partitions(self, start: dict, end: dict):
        if self._planned.needed:
            self._planned.seen(end)
        epoch, batch, parts = P.parse(end)
        spool.prepare(self.s.spool, epoch, batch)
        return [NSQPartition(epoch, batch, i, p) for i, p in enumerate(parts)]

    def read(self, partition):
        from .take import take

        yield from take(self.s, partition.part, partition.epoch, partition.batch, partition.index)

    def commit(self, end: dict) -> None:
        epoch, batch, _ = P.parse(end)
        # the batch that ends here stays until the next commit: its END markers are the
        # progress metrics, and AvailableNow counts what it took from them
        spool.delete_through(self.s.spool, epoch, batch - 1, self._retention)

    def _retention(self, ends: list) -> float:
        """How long a committed batch's spool stays: spoolRetention if given, else the longest
        msg_timeout nsqd granted its tasks (how long a lost FIN takes to come back) + margin."""
        if self.s.retention_given:
            return self.s.retention
        granted = [e["msg_timeout"] for e in ends if e.get("msg_timeout")]
        return max([self.s.retention] + [t + self.s.max_read_time + 30.0 for t in granted])

    def stop(self) -> None:  # no connection lives on the driver
        pass
