"""The nsq sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Each Spark task (one per partition) opens one producer connection and publishes its partition's
Arrow batches as pipelined MPUBs (DPUB for rows with ``defer_ms``), every OK awaited before the
task reports success. A lost connection fails over to the next nsqd (addresses rotated by
partition id, so partitions spread over the nodes); when every nsqd failed ``maxRetries`` times the
task fails and Spark retries it.

Delivery is **at least once**: a retried task, or a streaming micro-batch run again after a
failure, publishes its rows again. Consumers that need effectively-once dedupe on a key in the
body. The driver's commit adds the tasks' counts and prints one line on stderr.

The same per-task publishing also runs as a query (``publish_rows`` under ``mapInArrow``, see
nsqcli.spark.jobs.publish): each task returns its ledger as one row, so the caller gets the exact
acknowledged count as data, also through Spark Connect (whose driver is not the caller's process).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

try:  # Spark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
    _STREAM_ARROW = True
except ImportError:  # Spark 4.0: rows arrive as Row objects
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase
    _STREAM_ARROW = False

from . import options as opt


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one task published (travels from the executor to the driver's commit)."""

    partition: int
    messages: int
    bytes: int
    batches: int
    retries: int
    nsqd: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None  # set when the task stopped early: ``messages`` is what nsqd acknowledged


#: publish_rows' output: one row per task (the fields of NSQCommitMessage)
LEDGER_SCHEMA = ("partition int, messages long, bytes long, batches long, retries long, nsqd array<string>, "
                 "seconds double, error string")


class SinkSettings:
    """Everything a task needs, parsed (and checked) on the driver at planning time."""

    def __init__(self, options, schema):
        self.topic = (opt.topics(options, "topic", required=False) or [None])[0]
        fields = {f.name: f.dataType.simpleString() for f in schema.fields}
        from .arrow import check_schema
        check_schema(fields, self.topic)
        self.nsqd, self.lookupd = opt.endpoints(options)
        self.config = opt.config(options)
        self.batch_size = opt.number(options, "batchSize", 5000, minimum=1)
        self.window = opt.number(options, "maxInFlightBatches", 8, minimum=1)
        self.max_retries = opt.number(options, "maxRetries", 3, minimum=0)
        self.retry_backoff = opt.seconds(options, "retryBackoff") or 1.0
        self.timeout = opt.seconds(options, "timeout") or 30.0
        self.rate = opt.number(options, "ratePerSecond", None, minimum=1, integer=False)
        self.rate_partitions = opt.number(options, "numPartitions", None, minimum=1)
        if self.rate and not self.rate_partitions:
            raise opt.OptionError(
                "option 'ratePerSecond' needs option 'numPartitions' (how many partitions share the rate, "
                "e.g. df.rdd.getNumPartitions()): Spark does not tell a Python writer how many tasks run")
        self.max_body_size = opt.number(options, "maxBodySize", self.config.max_body_size, minimum=1024)
        self.max_msg_size = opt.number(options, "maxMessageSize", self.config.max_msg_size, minimum=1)

    def addresses(self, partition: int) -> list[str]:
        """nsqd addresses for this task: the given ones, else the nodes lookupd knows (those
        carrying the topic first), rotated by partition id."""
        addrs = list(self.nsqd)
        if not addrs:
            from ..client.http import cluster_view
            view = cluster_view(self.lookupd, self.topic, timeout=5.0)
            carrying = sorted(n.tcp_address for n in view.producers(self.topic)) if self.topic else []
            addrs = carrying or sorted(view.nodes)
            if not addrs:
                why = "; ".join(map(str, view.errors)) or "no nsqd is registered"
                raise RuntimeError(f"nsq sink: no nsqd found through lookupd ({why})")
        k = partition % len(addrs)
        return addrs[k:] + addrs[:k]


def publish_ledger(settings: SinkSettings, batches) -> NSQCommitMessage:
    """Publish one partition's record batches; never raises for a failed publish: the message's
    ``error`` says why the task stopped and ``messages`` how many nsqd acknowledged before."""
    from pyspark import TaskContext

    from ..client.producer import Producer
    from ..errors import PublishError
    from .arrow import Framer

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    start = time.monotonic()
    framer = Framer(settings.topic, settings.batch_size, settings.max_body_size, settings.max_msg_size)

    def stopped(published: int, why: str, retries: int = 0) -> NSQCommitMessage:
        return NSQCommitMessage(partition, published, 0, 0, retries, [], time.monotonic() - start,
                                f"nsq sink, partition {partition}: {why}")

    try:
        addresses = settings.addresses(partition)
    except Exception as e:  # lookupd found no nsqd
        return stopped(0, str(e).removeprefix("nsq sink: "))
    rate = settings.rate / settings.rate_partitions if settings.rate else None
    producer = Producer(addresses, settings.config)
    try:
        result = producer.publish_framed(framer.frames(batches), window=settings.window,
                                         timeout=settings.timeout, rate=rate,
                                         retries=settings.max_retries, retry_backoff=settings.retry_backoff)
    except PublishError as e:  # every error of the source or of nsqd, with the exact acknowledged count
        return stopped(e.published, str(e))
    finally:
        producer.close()
    if result.published != framer.rows:  # the ledger's count is the only truth: never report more
        return stopped(result.published, f"nsqd acknowledged {result.published} of {framer.rows} rows",
                       result.retries)
    return NSQCommitMessage(partition, result.published, framer.bytes, result.batches,
                            result.retries, result.nsqd, time.monotonic() - start)


def publish_partition(settings: SinkSettings, batches) -> NSQCommitMessage:
    """The writers' task: publish_ledger, raising (failing the task) unless all were acknowledged."""
    m = publish_ledger(settings, batches)
    if m.error:
        raise RuntimeError(f"{m.error} (the task fails; when Spark retries it, the acknowledged messages "
                           "are published again: at-least-once)")
    return m


#: run -> the first error a task of that run met in this Python worker (workers are reused
#: across a job's tasks): later tasks of the run skip publishing, as a failed job's would stop
_FAILED_RUNS: dict[str, str] = {}

SKIPPED = "skipped"


def publish_rows(settings: SinkSettings, run: str, batches):
    """``mapInArrow`` function: publish this partition, yield its ledger as one row
    (LEDGER_SCHEMA). A task that could not publish everything does not fail: its row carries the
    error and the exact count nsqd acknowledged, so the caller can add up what really happened.
    Once a task of ``run`` failed, the next ones in the same worker publish nothing (error
    "skipped: ..."): a dead nsqd costs each worker one round of retries, not each task."""
    import dataclasses

    import pyarrow as pa

    batches = iter(batches)
    earlier = _FAILED_RUNS.get(run)
    if earlier is not None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        m = NSQCommitMessage(ctx.partitionId() if ctx is not None else 0, 0, 0, 0, 0,
                             error=f"{SKIPPED}: not published after an earlier task's error ({earlier})")
    else:
        m = publish_ledger(settings, batches)
        if m.error:
            _FAILED_RUNS[run] = m.error
    if m.error:  # read the rest of the input: Spark reuses a worker only when its input was drained
        for _ in batches:
            pass
    yield pa.RecordBatch.from_pylist([dataclasses.asdict(m)], schema=_ledger_arrow_schema())


def _ledger_arrow_schema():
    import pyarrow as pa

    return pa.schema([("partition", pa.int32()), ("messages", pa.int64()), ("bytes", pa.int64()),
                      ("batches", pa.int64()), ("retries", pa.int64()), ("nsqd", pa.list_(pa.string())),
                      ("seconds", pa.float64()), ("error", pa.string())])


def rows_to_batches(rows, schema):
    """Spark 4.0's stream writer hands Rows: turn them into record batches of the same columns."""
    import pyarrow as pa

    names = [f.name for f in schema.fields if f.name in ("body", "topic", "defer_ms")]
    chunk: list = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= 10000:
            yield pa.record_batch([pa.array([r[n] for r in chunk]) for n in names], names=names)
            chunk = []
    if chunk:
        yield pa.record_batch([pa.array([r[n] for r in chunk]) for n in names], names=names)


def summary(messages, what: str) -> str:
    done = [m for m in messages if m is not None]
    total = sum(m.messages for m in done)
    nbytes = sum(m.bytes for m in done)
    nsqd = sorted({a for m in done for a in m.nsqd})
    failed = len(messages) - len(done)
    retries = sum(m.retries for m in done)
    line = (f"nsqcli.spark: {what}: published {total} messages ({nbytes} bytes) in {len(done)} "
            f"partition{'s' * (len(done) != 1)} to {', '.join(nsqd) or 'no nsqd'}")
    if retries:
        line += f" after {retries} retr{'ies' if retries != 1 else 'y'}"
    if failed:
        line += f"; {failed} task{'s' * (failed != 1)} failed"
    return line


class NSQWriter(DataSourceArrowWriter):
    def __init__(self, options, schema):
        self.settings = SinkSettings(options, schema)

    def write(self, iterator):
        return publish_partition(self.settings, iterator)

    def commit(self, messages):
        print(summary(messages, "write committed"), file=sys.stderr, flush=True)

    def abort(self, messages):
        print(summary(messages, "write ABORTED (published messages cannot be taken back)"),
              file=sys.stderr, flush=True)


class NSQStreamWriter(_StreamWriterBase):
    def __init__(self, options, schema):
        self.settings = SinkSettings(options, schema)
        self.schema = schema

    def write(self, iterator):
        batches = iterator if _STREAM_ARROW else rows_to_batches(iterator, self.schema)
        return publish_partition(self.settings, batches)

    def commit(self, messages, batchId):
        print(summary(messages, f"micro-batch {batchId}"), file=sys.stderr, flush=True)

    def abort(self, messages, batchId):
        print(summary(messages, f"micro-batch {batchId} ABORTED (published messages stay published)"),
              file=sys.stderr, flush=True)
