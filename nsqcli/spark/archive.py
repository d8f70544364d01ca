"""Archives as DataFrames: what ``nsqcli to-file`` and ``nsq_to_file`` wrote, read by Spark's own
text and JSON readers (gzip by the ``.gz`` extension, no Python in the read path).

Columns: ``body`` (binary), ``topic``, ``channel``, ``nsqd``, ``id``, ``timestamp``, ``attempts``
(from JSON envelopes; null in raw archives, except ``topic``), ``host`` and ``hour`` (parsed from
nsq_to_file-style names ``<TOPIC>.<HOST><REV>.<DATETIME>.log[.gz]`` with the default
``%Y-%m-%d_%H`` datetime, in UTC), and ``file``. In a raw archive the topic comes from the file
name, where the first dot ends it (JSON archives carry the exact topic).

``stream=True`` follows a directory: files moved into it (as to-file does on rotation) are read
once each, checkpointed by Spark like any file stream.
"""

from __future__ import annotations

import os

#: <TOPIC>.<HOST><REV>.<DATETIME>.log[.gz] (basename); groups: topic, host, datetime
NAME_REGEX = r"^([^./]+(?:\.[^./]+)*?)\.([^/]+?)(?:-[0-9]{6})?\.([0-9]{4}-[0-9]{2}-[0-9]{2}_[0-9]{2})\.log(?:\.gz)?$"

ENVELOPE_SCHEMA = ("topic string, channel string, nsqd string, id string, timestamp long, time string, "
                   "attempts int, body string, body_base64 string")

COLUMNS = ("body", "topic", "channel", "nsqd", "id", "timestamp", "attempts", "host", "hour", "file")


def _paths(path) -> list[str]:
    return [os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else [os.fspath(path)]


def _is_local(p: str) -> bool:
    return "://" not in p or p.startswith("file://")


def detect(paths: list[str]) -> str:
    """"json" or "raw" from the first record of a local archive; raw when nothing can be read."""
    from ..archive.reader import detect_format

    local = [p[len("file://"):] if p.startswith("file://") else p for p in paths if _is_local(p)]
    try:
        return (detect_format(local) if local else None) or "raw"
    except FileNotFoundError:
        raise
    except OSError:
        return "raw"


def detect_on_server(spark, paths: list[str]) -> str:
    """detect() where Spark reads: under Spark Connect the archives are the server's files,
    which this machine may not have. One small job over the first non-empty line Spark reads
    (a missing path is Spark's PATH_NOT_FOUND)."""
    from pyspark.sql import functions as F

    from ..archive.reader import _is_envelope

    rows = (spark.read.option("recursiveFileLookup", "true").option("lineSep", "\n").text(paths)
            .where(F.length("value") > 0).limit(1).collect())
    return "json" if rows and _is_envelope(rows[0][0].encode("utf-8")) else "raw"


def read_archive(spark, path, stream: bool = False, format: str = "auto", options: dict | None = None):
    """A DataFrame over the archives at ``path`` (a file, directory or glob, or a list of them).
    ``format``: "auto" (from the first record; local paths only, else raw; through Spark Connect
    read on the server), "raw" or "json".
    ``options`` go to Spark's reader (e.g. {"maxFilesPerTrigger": "1"} with stream=True)."""
    from pyspark.sql import functions as F

    paths = _paths(path)
    if format not in ("auto", "raw", "json"):
        raise ValueError(f"unknown archive format {format!r} (auto, raw, json)")
    if format == "auto":
        from .session import is_connect

        format = detect_on_server(spark, paths) if is_connect(spark) else detect(paths)
    reader = spark.readStream if stream else spark.read
    reader = reader.option("lineSep", "\n")
    if not stream:
        reader = reader.option("recursiveFileLookup", "true")
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    source = reader.format("text") if format == "raw" else reader.format("json").schema(ENVELOPE_SCHEMA)
    df = source.load(paths[0] if stream or len(paths) == 1 else paths)
    if stream and len(paths) > 1:
        raise ValueError("stream=True follows one directory (or glob)")

    df = df.withColumn("_file", F.col("_metadata.file_path"))
    base = F.regexp_extract(F.col("_file"), r"[^/]*$", 0)
    name_topic = F.regexp_extract(base, NAME_REGEX, 1)
    host = F.regexp_extract(base, NAME_REGEX, 2)
    dt = F.regexp_extract(base, NAME_REGEX, 3)
    hour = F.when(dt != "", F.expr(
        "make_timestamp(int(substr(_dt, 1, 4)), int(substr(_dt, 6, 2)), int(substr(_dt, 9, 2)), "
        "int(substr(_dt, 12, 2)), 0, 0, 'UTC')"))
    df = df.withColumn("_dt", dt)
    if format == "raw":
        df = df.select(
            F.col("value").cast("binary").alias("body"),
            F.when(name_topic != "", name_topic).alias("topic"),
            F.lit(None).cast("string").alias("channel"), F.lit(None).cast("string").alias("nsqd"),
            F.lit(None).cast("string").alias("id"), F.lit(None).cast("timestamp").alias("timestamp"),
            F.lit(None).cast("int").alias("attempts"),
            F.when(host != "", host).alias("host"), hour.alias("hour"), F.col("_file").alias("file"))
    else:
        df = df.where(F.col("body").isNotNull() | F.col("body_base64").isNotNull()).select(
            F.coalesce(F.unbase64("body_base64"), F.encode("body", "UTF-8")).alias("body"),
            F.coalesce("topic", F.when(name_topic != "", name_topic)).alias("topic"),
            "channel", "nsqd", "id",
            F.timestamp_micros(F.expr("timestamp div 1000")).alias("timestamp"),
            "attempts", F.when(host != "", host).alias("host"), hour.alias("hour"),
            F.col("_file").alias("file"))
    return df


def with_body_text(df):
    """The archive columns plus ``body_text`` (the body as UTF-8 text) - the ``messages`` table
    of ``nsqcli query`` and what ``replay --where`` sees."""
    from pyspark.sql import functions as F

    return df.withColumn("body_text", F.col("body").cast("string"))


def time_filter(df, since=None, until=None):
    """Rows in [since, until) (aware datetimes): by the envelope's timestamp when the archive has
    one, else by the hour in the file name (a file hour H counts when [H, H+1h) overlaps)."""
    from pyspark.sql import functions as F

    ts, hour = F.col("timestamp"), F.col("hour")
    if since is not None:
        s = F.timestamp_seconds(F.lit(since.timestamp()))
        df = df.where(F.when(ts.isNotNull(), ts >= s).otherwise(hour + F.expr("INTERVAL 1 HOUR") > s))
    if until is not None:
        u = F.timestamp_seconds(F.lit(until.timestamp()))
        df = df.where(F.when(ts.isNotNull(), ts < u).otherwise(hour < u))
    return df
