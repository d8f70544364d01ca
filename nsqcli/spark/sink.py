"""The nsq sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Each Spark task (one per partition) opens one producer connection and publishes its partition's
Arrow batches as pipelined MPUBs (DPUB for rows with ``defer_ms``), every OK awaited before the
task reports success. A lost connection fails over to the next nsqd (addresses rotated by
partition id, so partitions spread over the nodes); when every nsqd failed, the task goes round
them again with backoff for ``retryTimeout`` (60s: long enough for an nsqd restart) after the last
OK, then fails and Spark may retry it.

Delivery is **at least once**: a retried task, or a streaming micro-batch run again after a
failure, publishes its rows again. Consumers that need effectively-once dedupe on a key in the
body.

The driver's commit (or abort) prints one line on stderr, and never a count it does not know:
what the committed tasks acknowledged, and, when failed attempts came before (a committed task
with ``attemptNumber() > 0``, an aborted job's failed tasks), that more landed and how many when
that is known. It is known with ``commitReportPath`` (storage the driver and every executor can
write): each task attempt keeps a record there of what nsqd acknowledged (at its start, every
second as OKs come, and at its end), the driver adds the failed attempts' records to the
committed tasks' counts and writes one JSON report per write (a micro-batch: one per batch id),
atomically. The report is also how the totals reach a Spark Connect client.

The same per-task publishing also runs as a query (``publish_rows`` under ``mapInArrow``, see
nsqcli.spark.jobs.publish): each task returns its ledger as one row, so the caller gets the exact
acknowledged count as data, also through Spark Connect (whose driver is not the caller's process).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

try:  # Spark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
    _STREAM_ARROW = True
except ImportError:  # Spark 4.0: rows arrive as Row objects
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase
    _STREAM_ARROW = False

from . import options as opt
from .sink_report import AttemptRecord, attempts_dir, finish, report_path


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one task attempt published (travels from the executor to the driver's commit)."""

    partition: int
    messages: int
    bytes: int
    batches: int
    retries: int
    nsqd: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None  # set when the task stopped early: ``messages`` is what nsqd acknowledged
    attempt: int = 0  # TaskContext.attemptNumber(): > 0 means failed attempts of this task came before
    resent: int = 0  # sent without nsqd's answer on a lost connection (and sent again): possible duplicates
    attempt_id: str = ""  # this attempt's record under commitReportPath ("" without one)


#: publish_rows' output: one row per task (the fields of NSQCommitMessage but attempt_id)
LEDGER_SCHEMA = ("partition int, messages long, bytes long, batches long, retries long, nsqd array<string>, "
                 "seconds double, error string, attempt int, resent long")

#: the per-attempt records beside a batch write's report file, and in a streaming report directory
class SinkSettings:
    """Everything a task needs, parsed (and checked) on the driver at planning time."""

    def __init__(self, options, schema, streaming: bool = False):
        self.topic = (opt.topics(options, "topic", required=False) or [None])[0]
        fields = {f.name: f.dataType.simpleString() for f in schema.fields}
        from .arrow import check_schema
        check_schema(fields, self.topic)
        self.nsqd, self.lookupd = opt.endpoints(options)
        self.config = opt.config(options)
        self.batch_size = opt.number(options, "batchSize", 5000, minimum=1)
        self.window = opt.number(options, "maxInFlightBatches", 8, minimum=1)
        self.retry_timeout = _seconds_or(options, "retryTimeout", 60.0)
        self.retry_backoff = max(0.01, _seconds_or(options, "retryBackoff", 1.0))
        self.timeout = _seconds_or(options, "timeout", 30.0) or 30.0
        self.rate = opt.number(options, "ratePerTask", None, minimum=0.001, integer=False)
        self.max_body_size = opt.number(options, "maxBodySize", self.config.max_body_size, minimum=1024)
        self.max_msg_size = opt.number(options, "maxMessageSize", self.config.max_msg_size, minimum=1)
        self.report = report_path(options, streaming)

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


def _seconds_or(options, name: str, default: float) -> float:
    v = opt.seconds(options, name)
    return default if v is None else v


def _task():
    """(partition, attempt number, local property reader) of the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, lambda key: None
    return ctx.partitionId(), ctx.attemptNumber(), ctx.getLocalProperty


def publish_ledger(settings: SinkSettings, batches, record_dir: str | None = None) -> NSQCommitMessage:
    """Publish one partition's record batches; never raises for a failed publish: the message's
    ``error`` says why the task stopped and ``messages`` how many nsqd acknowledged before.
    With ``record_dir`` this attempt keeps its record there (see AttemptRecord)."""
    from ..client.producer import Producer
    from ..errors import PublishError
    from .arrow import Framer

    partition, attempt, _ = _task()
    start = time.monotonic()
    record = AttemptRecord(record_dir, partition, attempt) if record_dir else None
    framer = Framer(settings.topic, settings.batch_size, settings.max_body_size, settings.max_msg_size)

    def done(m: NSQCommitMessage) -> NSQCommitMessage:
        m.attempt = attempt
        if record is not None:
            m.attempt_id = record.id
            record.end(m)
        return m

    def stopped(published: int, why: str, retries: int = 0, resent: int = 0) -> NSQCommitMessage:
        return done(NSQCommitMessage(partition, published, 0, 0, retries, [], time.monotonic() - start,
                                     f"nsq sink, partition {partition}: {why}", resent=resent))

    try:
        addresses = settings.addresses(partition)
    except Exception as e:  # lookupd found no nsqd
        return stopped(0, str(e).removeprefix("nsq sink: "))
    producer = Producer(addresses, settings.config)
    try:
        result = producer.publish_framed(framer.frames(batches), window=settings.window,
                                         timeout=settings.timeout, rate=settings.rate,
                                         on_progress=record.progress if record is not None else None,
                                         retry_backoff=settings.retry_backoff, retry_for=settings.retry_timeout)
    except PublishError as e:  # every error of the source or of nsqd, with the exact acknowledged count
        # sent again after a lost connection, or sent and never answered: nsqd may hold them too
        maybe = (getattr(e, "resent", 0) or 0) + (getattr(e, "unanswered", 0) or 0)
        return stopped(e.published, str(e), resent=maybe)
    finally:
        producer.close()
    if result.published != framer.rows:  # the ledger's count is the only truth: never report more
        return stopped(result.published, f"nsqd acknowledged {result.published} of {framer.rows} rows",
                       result.retries, result.resent)
    return done(NSQCommitMessage(partition, result.published, framer.bytes, result.batches,
                                 result.retries, result.nsqd, time.monotonic() - start, resent=result.resent))


def publish_partition(settings: SinkSettings, batches, record_dir: str | None = None) -> NSQCommitMessage:
    """The writers' task: publish_ledger, raising (failing the task) unless all were acknowledged."""
    m = publish_ledger(settings, batches, record_dir)
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
                      ("seconds", pa.float64()), ("error", pa.string()), ("attempt", pa.int32()),
                      ("resent", pa.int64())])


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


class _Reporting:
    settings: SinkSettings

    def _finish(self, messages, committed: bool, what: str, records_dir: str | None, report: str | None,
                **about) -> None:
        finish(self.settings.topic, messages, committed, what, records_dir, report, **about)


class NSQWriter(_Reporting, DataSourceArrowWriter):
    def __init__(self, options, schema):
        self.settings = SinkSettings(options, schema)
        self.id = uuid.uuid4().hex  # this write: the same in every task's copy and in commit's

    def _records(self) -> str | None:
        return attempts_dir(self.settings.report, self.id, False) if self.settings.report else None

    def write(self, iterator):
        return publish_partition(self.settings, iterator, self._records())

    def commit(self, messages):
        self._finish(messages, True, "write committed", self._records(), self.settings.report,
                     write_id=self.id, batch_id=None)

    def abort(self, messages):
        self._finish(messages, False, "write ABORTED (published messages cannot be taken back)", self._records(),
                     self.settings.report, write_id=self.id, batch_id=None)


#: the local property Spark's micro-batch execution sets to the running batch's id
BATCH_ID = "streaming.sql.batchId"


class NSQStreamWriter(_Reporting, _StreamWriterBase):
    def __init__(self, options, schema):
        self.settings = SinkSettings(options, schema, streaming=True)
        self.schema = schema

    def _records(self, batch_id) -> str | None:
        return attempts_dir(self.settings.report, str(batch_id), True) if self.settings.report else None

    def write(self, iterator):
        batches = iterator if _STREAM_ARROW else rows_to_batches(iterator, self.schema)
        records = None
        if self.settings.report:
            batch_id = _task()[2](BATCH_ID)
            records = self._records(batch_id if batch_id is not None else "unknown")
        return publish_partition(self.settings, batches, records)

    def commit(self, messages, batchId):
        self._finish(messages, True, f"micro-batch {batchId}", self._records(batchId),
                     self._report(batchId), batch_id=batchId, write_id=None)

    def abort(self, messages, batchId):
        self._finish(messages, False, f"micro-batch {batchId} ABORTED (published messages stay published)",
                     self._records(batchId), self._report(batchId), batch_id=batchId, write_id=None)

    def _report(self, batch_id) -> str | None:
        return os.path.join(self.settings.report, f"{batch_id}.json") if self.settings.report else None
