"""The nsq source's plan: what each task of a micro-batch takes from which nsqd.

The driver decides, from nsqd's ``/stats`` (channel depth per topic and node), how many messages
each partition takes; the plan travels in the batch's end offset, so a batch Spark runs again
(a retried task, a restart from the checkpoint) is the same batch: same partitions, same spool
files (see spool.py). Pure Python: no pyspark, no sockets; the parsing is testable without a JVM.

Offsets are ``{"v": 2, "epoch": E, "batch": N, "plan": [[topic, nsqd, share], ...]}``: ``epoch``
names the query's spool (a new checkpoint starts a new epoch), ``batch`` counts the batches that
took something, ``plan`` is the batch that ends at this offset.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

from . import options as opt

SCHEMA = ("body binary, id string, timestamp timestamp, attempts int, nsqd string, "
          "topic string, channel string")
COLUMNS = ("body", "id", "timestamp", "attempts", "nsqd", "topic", "channel")

DEFAULT_MAX_PER_BATCH = 500_000
DEFAULT_MAX_PER_PARTITION = 100_000


class Target(NamedTuple):
    """One topic on one nsqd: ``http`` is None when only its TCP address is known (then its
    depth is unknown and every batch sends it one partition that takes what is there)."""

    topic: str
    tcp: str
    http: str | None


class Part(NamedTuple):
    topic: str
    tcp: str
    share: int


class SourceSettings:
    """The stream source's options, parsed and checked (on the driver, at load())."""

    def __init__(self, options):
        self.topics = opt.topics(options, "topic")
        self.channel = opt.channel(options)
        if self.channel.endswith("#ephemeral") or any(t.endswith("#ephemeral") for t in self.topics):
            raise opt.OptionError("an #ephemeral channel or topic cannot be read exactly once: nsqd deletes it "
                                  "(and what it holds) whenever no task is connected, i.e. between batches")
        self.nsqd_http = opt.addresses(options, "nsqdHTTPAddresses")
        self.nsqd = opt.addresses(options, "nsqdTCPAddresses")
        self.lookupd = opt.addresses(options, "lookupdHTTPAddresses")
        if not (self.nsqd or self.nsqd_http or self.lookupd):
            raise opt.OptionError("give option 'lookupdHTTPAddresses', 'nsqdHTTPAddresses' or "
                                  "'nsqdTCPAddresses' (comma-separated HOST:PORT)")
        spool = opt.string(options, "spoolLocation")
        if spool is None:
            raise opt.OptionError(
                "option 'spoolLocation' is required: a directory every executor can write, where each "
                "task keeps what it took until Spark commits the batch (e.g. the query's "
                "checkpointLocation + '/spool')")
        if spool.startswith("file://"):
            spool = spool[len("file://"):]
        if "://" in spool:
            raise opt.OptionError(
                f"option 'spoolLocation': {spool!r} is not a filesystem path: the spool is written by "
                "Python tasks, so it must be a mounted path (local disk in local mode, a shared mount "
                "such as NFS on a cluster), not hdfs:// or s3://")
        if not os.path.isabs(spool):
            raise opt.OptionError(f"option 'spoolLocation' must be an absolute path, not {spool!r} "
                                  "(executors do not share the driver's working directory)")
        self.spool = os.path.normpath(spool)
        self.max_per_batch = opt.number(options, "maxMessagesPerBatch", DEFAULT_MAX_PER_BATCH, minimum=1)
        self.max_per_partition = opt.number(options, "maxMessagesPerPartition", DEFAULT_MAX_PER_PARTITION,
                                            minimum=1)
        self.min_partitions = opt.number(options, "minPartitions", 1, minimum=1)
        # a tag put in each end offset this reader plans: a run tells its own batches from a crashed
        # run's planned batch that Spark runs again (to-parquet --available-now), without clocks
        self.planned_by = opt.string(options, "plannedBy")
        self.max_read_time = _between(options, "maxReadTime", 10.0, 0.001, 600.0)
        self.read_idle = _between(options, "readIdleTimeout", 0.5, 0.001, 600.0)
        self.connect_timeout = _between(options, "connectTimeout", 15.0, 0.001, 3600.0)
        self.config = opt.config(options)
        if self.config.msg_timeout is not None and not 1.0 <= self.config.msg_timeout <= 900:
            raise opt.OptionError("option 'msgTimeout' must be between 1s and 15m")
        # committed spools stay this long: nsqd redelivers a message whose FIN was lost after
        # msg_timeout (nsqd's default 60s), and a task recognises it in the spool until then
        retention = opt.seconds(options, "spoolRetention")
        self.retention_given = retention is not None
        self.retention = ((self.config.msg_timeout or 60.0) + self.max_read_time + 30.0
                          if retention is None else retention)
        if retention is not None and self.config.msg_timeout and 0 < retention < self.config.msg_timeout:
            raise opt.OptionError(
                f"option 'spoolRetention' ({retention:g}s) must be longer than 'msgTimeout' "
                f"({self.config.msg_timeout:g}s): a message whose FIN was lost comes back after msg_timeout, "
                "and is recognised only while its spool is kept (0 keeps nothing: tests only)")


def _between(options, name: str, default: float, low: float, high: float) -> float:
    v = opt.seconds(options, name)
    if v is None:
        return default
    if not low <= v <= high:
        raise opt.OptionError(f"option {name!r} must be more than 0 and at most {high:g}s, not "
                              f"{opt.string(options, name)!r}")
    return v


# -- offsets -----------------------------------------------------------------------------------------
def initial(epoch: str) -> dict:
    return {"v": 2, "epoch": epoch, "batch": 0, "plan": []}


def parse(offset: dict) -> tuple[str, int, list[Part]]:
    """(epoch, batch, plan) of an offset; a checkpoint of the old source is refused clearly."""
    if not isinstance(offset, dict) or offset.get("v") != 2:
        raise ValueError(
            f"nsq data source: offset {offset!r} was written by an older nsqcli source (it read on "
            "the driver, at-least-once); start this query with a new checkpointLocation (what the "
            "old one had not committed, nsqd delivers again)")
    return str(offset["epoch"]), int(offset["batch"]), [Part(*p) for p in offset.get("plan") or []]


def offset(epoch: str, batch: int, plan: list[Part], depth: int, last: dict | None = None) -> dict:
    """A batch's end offset: its plan, the depth seen, and (``last``) the lateness of the batch
    before it (lastBatch, ...SpooledRows, ...OldestMessageAgeMs, ...Redelivered) and when it
    was planned (plannedAtMs)."""
    return {"v": 2, "epoch": epoch, "batch": batch, "plan": [list(p) for p in plan], "depth": depth,
            **(last or {})}


# -- the plan ----------------------------------------------------------------------------------------
def plan_batch(depths: list[tuple[Target, int]], cap: int | None, per_partition: int,
               min_partitions: int = 1) -> list[Part]:
    """Partitions for one batch: each target's depth (None: unknown) split into shares of at most
    ``per_partition``, the whole at most ``cap`` (shared in proportion to depth), then the largest
    shares halved until there are ``min_partitions``. A target of unknown depth asks for one share
    of ``per_partition`` (its task takes what is there within the read time), within the cap like
    the others."""
    wants = ([(t, max(0, d)) for t, d in depths if d is not None]
             + [(t, per_partition) for t, d in depths if d is None])
    total = sum(d for _, d in wants)
    takes = wants
    if cap is not None and total > cap:
        takes = [(t, d * cap // total) for t, d in wants]
        short = cap - sum(s for _, s in takes)
        order = sorted(range(len(takes)), key=lambda i: -(wants[i][1] * cap % total))
        for i in order[:short]:
            takes[i] = (takes[i][0], takes[i][1] + 1)
    parts: list[Part] = []
    for t, n in takes:
        if n <= 0:
            continue
        k = math.ceil(n / per_partition)
        base, extra = divmod(n, k)
        parts += [Part(t.topic, t.tcp, base + (1 if i < extra else 0)) for i in range(k)]
    while parts and len(parts) < min_partitions:
        parts.sort(key=lambda p: -p.share)
        big = parts[0]
        if big.share < 2:
            break
        half = big.share // 2
        parts[0:1] = [Part(big.topic, big.tcp, big.share - half), Part(big.topic, big.tcp, half)]
    return parts
