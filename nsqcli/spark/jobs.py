"""The Spark side of nsqcli's Spark commands (the CLI layer never touches pyspark itself)."""

from __future__ import annotations


def archive_selection(spark, archives, since=None, until=None, where=None, from_topics=(), fmt="auto"):
    """replay's rows: the archives, filtered by time, topic and a SQL condition."""
    from pyspark.sql import functions as F

    from .archive import read_archive, time_filter, with_body_text

    df = with_body_text(read_archive(spark, list(archives), format=fmt))
    df = time_filter(df, since, until)
    if from_topics:
        df = df.where(F.col("topic").isin(list(from_topics)))
    if where:
        df = df.where(where)
    return df


def counts_by_topic_and_hour(df) -> list[tuple]:
    """[(topic, UTC hour or None, count)] sorted: replay --dry-run. The hour is an aware datetime
    in UTC, cut on the epoch: a timestamp pyspark collects comes back in the collecting
    machine's local time, and date_trunc cuts in the session's time zone (a half-hour zone's
    hours are not UTC's), so neither is used."""
    import datetime as dt

    from pyspark.sql import functions as F

    micros = "unix_micros(coalesce(timestamp, hour))"  # div truncates toward 0: floored by hand (pre-1970)
    hour = F.expr(f"({micros} - pmod({micros}, 3600000000)) div 3600000000")
    rows = df.groupBy("topic", hour.alias("h")).count().orderBy("topic", "h").collect()
    return [(r["topic"], None if r["h"] is None else dt.datetime.fromtimestamp(r["h"] * 3600, dt.timezone.utc),
             r["count"]) for r in rows]


def publish(df, options: dict, rate: float | None = None) -> list[dict]:
    """Publish the rows of ``df`` (a ``body`` column) with the nsq sink's per-task logic and
    return every task's ledger (sink.LEDGER_SCHEMA as dicts): what nsqd acknowledged, also for
    the tasks that stopped early (their ``error``).

    The ledgers come back as the query's result rows (``mapInArrow``), not through the sink's
    driver-side commit: under Spark Connect that commit runs in the server's driver, whose files
    and stderr the client never sees. ``rate`` (messages/s for the whole job) becomes the sink's
    ``ratePerTask``: the rate over the tasks that run at once (the session's parallelism, or
    fewer partitions). Once a task failed, later tasks in its worker publish nothing (their
    ``error`` starts with "skipped"), as the tasks of a failed job would not run."""
    import functools
    import uuid

    from .sink import LEDGER_SCHEMA, SinkSettings, publish_rows

    options = dict(options)
    if rate:
        df, per_task = rate_per_task(df, rate)
        options["ratePerTask"] = repr(per_task)
    settings = SinkSettings(options, df.schema)
    run = uuid.uuid4().hex  # this publish, for the workers (reused across jobs)
    rows = df.mapInArrow(functools.partial(publish_rows, settings, run), LEDGER_SCHEMA).collect()
    return [r.asDict() for r in rows]


def parallelism(spark) -> int:
    """How many tasks the session runs at once (its default parallelism: the cores it has)."""
    from .session import is_connect

    if not is_connect(spark):
        return max(1, spark.sparkContext.defaultParallelism)
    # no SparkContext through Connect: a range without a partition count gets the default parallelism
    from pyspark.sql import functions as F

    return max(1, spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).distinct().count())


def rate_per_task(df, rate: float):
    """(df, messages/s per task) so that the tasks running at once publish ``rate`` in all: Spark
    does not tell a Python task how many others run beside it, so the split is decided here.
    Through Connect (no partition count to ask) the rows are repartitioned to the parallelism."""
    from .session import is_connect

    slots = parallelism(df.sparkSession)
    if is_connect(df.sparkSession):
        df = df.repartition(slots)
        n = slots
    else:
        n = df.rdd.getNumPartitions()
    return df, rate / max(1, min(n, slots))


def messages_table(spark, archives, fmt="auto", name="messages") -> None:
    """query's table."""
    from .archive import read_archive, with_body_text

    with_body_text(read_archive(spark, list(archives), format=fmt)).createOrReplaceTempView(name)


def start_to_parquet(spark, options: dict, output: str, checkpoint: str, partition_by: list[str],
                     trigger_seconds: float, dedupe_seconds: float | None, available_now: bool,
                     fmt: str = "parquet"):
    """The to-parquet streaming query (started): nsq source -> (dedupe) -> Parquet, or a Delta
    Lake or Iceberg table (``fmt``; nsqcli.spark.tables)."""
    from pyspark.sql import functions as F

    from .tables import start

    df = spark.readStream.format("nsq").options(**options).load()
    if dedupe_seconds is not None:
        df = (df.withWatermark("timestamp", f"{int(dedupe_seconds)} seconds")
              .dropDuplicatesWithinWatermark(["nsqd", "topic", "id"]))  # ids are unique per topic only
    df = df.withColumn("date", F.to_date("timestamp")).withColumn("hour", F.hour("timestamp"))
    trigger = ({"availableNow": True} if available_now
               else {"processingTime": f"{int(trigger_seconds * 1000)} milliseconds"})
    return start(spark, df, fmt, output, checkpoint, partition_by, trigger)
