"""``nsqcli to-parquet``: NSQ into a Parquet dataset through Structured Streaming (nsq source)."""

from __future__ import annotations

import threading
import time

import click

from ..command import command, option
from ..options import connection_options, pop_connection, topic_arguments
from ..spark_options import require_extra, spark_session, sink_options, spark_error, spark_options
from ..types import DURATION, HTTP_ADDRESS


@command("to-parquet", examples="""
nsqcli to-parquet -t events -o /data/events --checkpoint /data/_ck/events
nsqcli to-parquet -t events -o /data/events --checkpoint /data/_ck/events --available-now
nsqcli to-parquet -t a -t b -o s3a://bucket/nsq --checkpoint s3a://bucket/_ck --master spark://10.0.0.5:7077
nsqcli to-parquet -t events -o /lake/events --checkpoint /lake/_ck/events --format delta
nsqcli to-parquet -t events -o /lake/events --checkpoint /lake/_ck/events --format iceberg
""")
@topic_arguments(many=True, channel="option", channel_default="nsqcli_to_parquet",
                 topic_help="Topic to archive (repeatable; or as arguments).")
@option("-o", "--output", required=True, metavar="DIR",
        help="The Parquet dataset, or the table's directory (a path or URL); for --format iceberg its "
             "parent directory is the warehouse of a Hadoop catalog and its last part the table's name.")
@option("--format", "fmt", type=click.Choice(["parquet", "delta", "iceberg"]), default="parquet",
        show_default=True,
        help="parquet: Spark's file sink; delta / iceberg: a Delta Lake / Iceberg table, its jar fetched "
             "by Spark from Maven Central on the first run and cached (~/.ivy2.5.2). Delta needs Spark 4.0, "
             "4.1 or 4.2, Iceberg 4.0 or 4.1; --conf spark.jars.packages=... brings your own jar.")
@option("--checkpoint", required=True, metavar="DIR",
              help="Spark checkpoint; restart with the same one to go on where it stopped.")
@option("--partition-by", default="topic,date", show_default=True,
              help="Comma-separated partition columns (any of the columns, plus date and hour); '' for none.")
@option("--trigger", "trigger", type=DURATION, default="10s", show_default=True,
              help="Micro-batch interval (0: as fast as possible).")
@option("--max-messages-per-batch", type=click.IntRange(min=1), default=500000, show_default=True,
              help="Cap per micro-batch (a batch takes what the channel held when it was planned).")
@option("--max-messages-per-partition", type=click.IntRange(min=1), default=100000, show_default=True,
              help="Cap per Spark task: deeper channels are read by more tasks at once.")
@option("--spool", metavar="DIR",
              help="Where tasks keep what they took until Spark commits it; a path every executor "
                   "reaches (default: CHECKPOINT/spool when the checkpoint is a local path).")
@option("--nsqd-http-address", "nsqd_http", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS",
              help="nsqd HTTP address (repeatable): the driver reads its channel depth to plan each batch "
                   "(with only TCP addresses the depth is unknown and every trigger runs a batch).")
@option("--dedupe", is_flag=True, help="Also drop messages with the same nsqd, topic and id within "
              "--dedupe-watermark (not needed for exactly-once: the spool does that).")
@option("--dedupe-watermark", type=DURATION, default="1h", show_default=True)
@option("--available-now", is_flag=True,
              help="Take as many messages as the channel held at the start, then exit 0 (batch jobs, CI). "
                   "NSQ has no offsets: a message given back to nsqd meanwhile goes behind newer ones and may "
                   "be left for the next run. Spark < 4.2 runs one batch per query start: the query is "
                   "started again until that many are taken.")
@spark_options
@connection_options(consumer=True)
@click.pass_obj
def to_parquet(app, topics, channel, output, fmt, checkpoint, partition_by, trigger, max_messages_per_batch,
               max_messages_per_partition, spool, nsqd_http, dedupe, dedupe_watermark, available_now, master, remote, confs, py_files, spark_log_level, **kwargs):
    """Consume TOPIC(s) into a Parquet dataset, Delta Lake or Iceberg table with Spark.

    \b
    Exactly once: Spark's tasks read from nsqd on the executors and keep what they took in the
    spool before they FIN it, so a retried task or a batch run again after a crash reads the
    spool, not nsqd. SIGTERM/SIGINT/SIGHUP stop the query cleanly: the running batch closes early and is
    committed; a restart with the same --checkpoint goes on where it stopped, with nothing lost
    and nothing twice.
    Delta Lake and Iceberg commit each micro-batch once by its id, as Spark's Parquet sink does.
    Columns: body, id, timestamp, attempts, nsqd, topic, channel (+ date, hour).
    """
    conn = pop_connection(kwargs)
    cols = [c.strip() for c in partition_by.split(",") if c.strip()]
    known = {"body", "id", "timestamp", "attempts", "nsqd", "topic", "channel", "date", "hour"}
    bad = [c for c in cols if c not in known]
    if bad:
        raise click.UsageError(f"--partition-by: unknown column {bad[0]!r} (columns: {', '.join(sorted(known))})")
    spool = _spool_dir(spool, checkpoint)
    require_extra("to-parquet", remote)  # before --format's checks, which read nsqcli.spark.tables
    confs = _table_confs(fmt, output, confs, remote)
    with spark_session(app, "to-parquet", master, remote, confs, py_files, spark_log_level) as spark:
        return _run(app, spark, topics, channel, output, checkpoint, cols, trigger, max_messages_per_batch,
                    max_messages_per_partition, spool, nsqd_http, dedupe, dedupe_watermark, available_now, conn,
                    fmt)


def _table_confs(fmt: str, output: str, confs: tuple, remote) -> tuple:
    """The session's confs for --format; a Spark that no jar of the format works with, or an
    --output that holds another format, is refused here, before Spark starts (exit 2)."""
    from ...spark import tables

    held = tables.format_of_existing(output)
    if held and held != fmt:
        have, want = tables.describe(held), tables.describe(fmt)
        raise click.UsageError(f"--output {output} holds {_a(have)}, not {_a(want)}: give --format {held}, "
                               "or another --output")
    if fmt == "parquet":
        return confs
    version = None
    if not remote:  # a Connect server's Spark, jars and extensions are its own
        from importlib import metadata

        try:
            version = metadata.version("pyspark")
        except metadata.PackageNotFoundError:
            return confs  # the session says what to install
        user = dict(kv.partition("=")[::2] for kv in confs)
        why = tables.refusal(fmt, version, {k.strip(): v for k, v in user.items()})
        if why:
            raise click.UsageError(why)
    return tables.session_confs(fmt, version, output, confs, remote=bool(remote))


def _spool_dir(spool: str | None, checkpoint: str) -> str:
    import os

    if spool is None:
        local = checkpoint[len("file://"):] if checkpoint.startswith("file://") else checkpoint
        if "://" in local:
            raise click.UsageError(f"--checkpoint {checkpoint} is not a local path: give --spool DIR, a "
                                   "directory every executor reaches (a shared mount on a cluster)")
        spool = os.path.join(local, "spool")
    spool = spool[len("file://"):] if spool.startswith("file://") else spool
    if "://" in spool:
        raise click.UsageError(f"--spool {spool}: the spool is written by Python tasks with POSIX calls: give a "
                               "mounted path every executor reaches (NFS...), not a URL")
    return os.path.abspath(spool)


def _run(app, spark, topics, channel, output, checkpoint, cols, trigger, per_batch, per_partition, spool, nsqd_http,
         dedupe, watermark, available_now, conn, fmt="parquet"):
    from ..app import stop_on_signals

    options = {**sink_options(conn), "topic": ",".join(topics), "channel": channel,
               "maxMessagesPerBatch": str(per_batch), "maxMessagesPerPartition": str(per_partition),
               "spoolLocation": spool}
    if nsqd_http:
        from ...client.http import base_url

        options["nsqdHTTPAddresses"] = ",".join(  # https:// kept, http:// and paths dropped
            u if u.startswith("https://") else u.split("://", 1)[1] for u in map(base_url, nsqd_http))
        if not conn.get("nsqd_tcp_addresses"):  # not the default 127.0.0.1:4150 beside them
            options.pop("nsqdTCPAddresses", None)
    from ...spark.jobs import start_to_parquet
    from ...spark.spool import clear_stop

    clear_stop(spool)  # left by a run killed while it stopped
    from ...spark_features import source_available_now_in_batches

    # Spark < 4.2 runs an AvailableNow query over a Python source as Trigger.Once: one batch per
    # start (after a crash, the interrupted one), so the query is started again until a start
    # takes nothing, or (after the first) less than a whole batch: the channel was drained
    again = available_now and not source_available_now_in_batches(spark.version)
    stopping = threading.Event()
    stop_on_signals(stopping)
    seen: dict = {}
    last_report = time.monotonic()
    starts, target, base = 0, None, 0
    if again:  # this run's tag in the offsets it plans: a crashed run's batch run again has another
        import uuid

        options["plannedBy"] = tag = uuid.uuid4().hex
    while True:
        before = sum(seen.values())
        try:
            q = start_to_parquet(spark, options, output, checkpoint, cols, trigger,
                                 watermark if dedupe else None, available_now, fmt)
        except Exception as e:
            raise spark_error(e) from None
        starts += 1
        _wait(app, q, seen, spool, stopping, last_report)
        took = sum(seen.values()) - before
        if again and target is None:  # what the channel held at this run's first plan: the target,
            found = _planned_depth(q, tag)  # counted from that plan's batch on (not from this start:
            if found is not None:           # a start that ran a crashed run's batch first counts it)
                target, first = found
                base = sum(n for b, n in seen.items() if b < first)
        if not again or stopping.is_set() or took == 0 or (starts > 1 and took < per_batch) \
                or (target is not None and sum(seen.values()) - base >= target):
            break
    from ...spark.tables import describe

    app.info(f"to-parquet: {sum(seen.values())} rows in {len(seen)} batches written to the "
             f"{describe(fmt)} {output}")
    return 0


def _a(noun: str) -> str:
    return ("an " if noun[0].lower() in "aeiou" else "a ") + noun


def _planned_depth(q, tag: str) -> tuple[int, int] | None:
    """(depth, batch id): the channel depth the source saw when it planned the first batch of
    this run, and that batch: the first end offset carrying this run's ``tag`` (its ``depth``; a
    batch run again after a crash was planned by that run, and saw an old depth; pyspark 4.0
    gives offsets as dict text, not JSON); None if none yet."""
    import ast
    import json

    for p in q.recentProgress:
        if not p.numInputRows or not p.sources:
            continue
        text = p.sources[0].endOffset
        try:
            end = json.loads(text)
        except (TypeError, ValueError):
            try:
                end = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return None
        if not isinstance(end, dict) or end.get("plannedBy") != tag:
            continue  # planned by an earlier run
        depth = end.get("depth")
        return (depth, p.batchId) if isinstance(depth, int) and depth > 0 else None
    return None


def _wait(app, q, seen: dict, spool: str, stopping, last_report: float) -> None:
    """Until the query ends (or is stopped on a signal), with a progress line every 10 s (-v:
    every batch); ``seen`` gets each batch's row count."""
    from ...spark.spool import clear_stop, request_stop

    def collect() -> list:
        # by attribute: under Spark Connect a StreamingQueryProgress's dict entry numInputRows is
        # None (only the attribute is set), and 0 rows would be reported
        new = [p for p in q.recentProgress if p.batchId is not None and p.batchId not in seen]
        for p in new:
            seen[p.batchId] = int(p.numInputRows or 0)
        return new

    while not q.awaitTermination(0.5):
        for prog in collect():
            if app.verbosity >= 1 or (app.verbosity >= 0 and time.monotonic() - last_report >= 10):
                last_report = time.monotonic()
                app.info(f"to-parquet: batch {prog.batchId}: {prog.numInputRows} rows, "
                         f"{prog.processedRowsPerSecond or 0:,.0f} rows/s; "
                         f"{sum(seen.values())} rows in {len(seen)} batches")
        if stopping.is_set():
            if request_stop(spool):
                app.info("to-parquet: stopping: the running batch closes at its tasks' next chunk and is committed")
            else:  # the spool is not reachable from here (Spark Connect elsewhere) or nothing was planned yet
                app.info("to-parquet: stopping after the running batch (at most 30 s)")
            try:
                _stop_between_batches(q, mark=lambda: request_stop(spool))
            finally:
                clear_stop(spool)
            break
    if q.exception() is not None:
        raise spark_error(q.exception()) from None
    collect()


def _stop_between_batches(q, patience: float = 30.0, mark=None) -> None:
    """Stop when no micro-batch is running, if that moment comes within ``patience`` seconds:
    a batch interrupted by stop() leaves Parquet files that Spark's _spark_metadata log does not
    list (Spark's readers ignore them; a plain glob of the directory would not). ``mark()`` is
    called every 0.2 s meanwhile (a batch planned while stopping is asked to stop too)."""
    deadline = time.monotonic() + patience
    marked = time.monotonic()
    while time.monotonic() < deadline:
        try:
            if not q.status.get("isTriggerActive"):
                break
        except Exception:  # the query ended meanwhile
            break
        if mark is not None and time.monotonic() - marked >= 0.2:
            mark()
            marked = time.monotonic()
        time.sleep(0.02)
    q.stop()
