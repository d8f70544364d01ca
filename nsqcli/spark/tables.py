"""Delta Lake and Iceberg tables for ``nsqcli to-parquet --format``: which jar for which Spark
(as measured: README, "Tables"), the session's configuration for it, and the one-line refusal of
a Spark no release is built for.

The jars come from Maven Central through Spark's own ``spark.jars.packages`` (Ivy), resolved
when the JVM starts and cached in ``~/.ivy2.5.2`` (``spark.jars.ivy`` moves it): only the first
run on a machine downloads them. Nothing here imports pyspark.
"""

from __future__ import annotations

import os

FORMATS = ("parquet", "delta", "iceberg")

from ..spark_features import DELTA, ICEBERG, MEASURED_PYSPARK  # the measured matrix (pure data)

# what a user's own --conf spark.jars.packages / spark.jars names to bring the format itself
_OWN_JAR = {"delta": ("io.delta:delta-spark", "delta-spark_"), "iceberg": ("iceberg-spark-runtime",)}
_NAME = {"parquet": "Parquet dataset", "delta": "Delta Lake table", "iceberg": "Iceberg table"}
ICEBERG_CATALOG = "nsqcli"  # a Hadoop catalog whose warehouse is --output's parent directory


def describe(fmt: str) -> str:
    return _NAME[fmt]


def spark_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def package(fmt: str, spark_version: str) -> str | None:
    """The Maven coordinates of ``fmt``'s jar for this Spark, None where none works."""
    table = {"delta": DELTA, "iceberg": ICEBERG}.get(fmt)
    return None if table is None else table.get(spark_minor(spark_version))


def _own_jar(fmt: str, confs: dict) -> bool:
    given = f"{confs.get('spark.jars.packages', '')},{confs.get('spark.jars', '')}"
    return any(mark in given for mark in _OWN_JAR.get(fmt, ()))


def refusal(fmt: str, spark_version: str, confs: dict | None = None) -> str | None:
    """One line why ``fmt`` cannot be written with this Spark, naming a working combination; None
    when it can (or when the user brings the jar: --conf spark.jars.packages/spark.jars)."""
    if fmt == "parquet" or package(fmt, spark_version) or _own_jar(fmt, confs or {}):
        return None
    table = DELTA if fmt == "delta" else ICEBERG
    minors = sorted(table, key=lambda m: tuple(map(int, m.split("."))))
    newest = minors[-1]
    name = "Delta Lake" if fmt == "delta" else "Iceberg"
    return (f"--format {fmt}: no {name} release works with Spark {spark_version} (the installed pyspark); "
            f"use pyspark {', '.join(minors[:-1])} or {newest}, e.g. pip install 'pyspark=={MEASURED_PYSPARK[newest]}' "
            f"(with {table[newest]})")


def location(output: str) -> str:
    """--output as the table's location: an absolute path for a local one, a URL as given."""
    out = output.rstrip("/") or output
    if out.startswith("file://"):
        out = out[len("file://"):]
    return out if "://" in out else os.path.abspath(out)


def iceberg_table(output: str) -> str:
    """The table's name in the nsqcli Hadoop catalog: the last part of --output (whose parent
    directory is the catalog's warehouse, so the table's location is --output itself)."""
    name = location(output).rsplit("/", 1)[-1]
    return f"{ICEBERG_CATALOG}.`{name.replace('`', '``')}`"


def session_confs(fmt: str, spark_version: str | None, output: str, confs: tuple = (),
                  remote: bool = False) -> tuple:
    """The --conf KEY=VALUE tuple for the session: the format's jar, extension and catalog first,
    the user's own after (theirs win; spark.jars.packages and spark.sql.extensions are joined).
    ``remote`` (Spark Connect): only the Iceberg catalog (a SQL conf a client may set); the
    server's jars and extensions are its own."""
    if fmt == "parquet":
        return tuple(confs)
    user = {}
    for kv in confs:
        k, sep, v = kv.partition("=")
        if sep:
            user[k.strip()] = v
    ours: dict[str, str] = {}
    pkg = package(fmt, spark_version) if spark_version and not remote else None
    if pkg and not _own_jar(fmt, user):
        ours["spark.jars.packages"] = pkg
    if remote:
        pass
    elif fmt == "delta":
        ours["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        ours["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    else:
        ours["spark.sql.extensions"] = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    if fmt == "iceberg":
        cat = f"spark.sql.catalog.{ICEBERG_CATALOG}"
        ours[cat] = "org.apache.iceberg.spark.SparkCatalog"
        ours[f"{cat}.type"] = "hadoop"
        parent = location(output).rsplit("/", 1)[0] or "/"
        ours[f"{cat}.warehouse"] = parent
    for joined in ("spark.jars.packages", "spark.sql.extensions"):
        if joined in user and joined in ours and ours[joined] not in user[joined].split(","):
            user[joined] = f"{ours[joined]},{user[joined]}"
    merged = {**ours, **user}
    return tuple(f"{k}={v}" for k, v in merged.items())


def format_of_existing(output: str) -> str | None:
    """What a local --output already holds: "delta" (_delta_log), "iceberg" (metadata/*.json),
    "parquet" (Spark's _spark_metadata), or None (new, empty, or a URL: not looked at)."""
    loc = location(output)
    if "://" in loc or not os.path.isdir(loc):
        return None
    if os.path.isdir(os.path.join(loc, "_delta_log")):
        return "delta"
    meta = os.path.join(loc, "metadata")
    if os.path.isdir(meta) and any(f.endswith(".metadata.json") for f in os.listdir(meta)):
        return "iceberg"
    if os.path.isdir(os.path.join(loc, "_spark_metadata")):
        return "parquet"
    return None


def start(spark, df, fmt: str, output: str, checkpoint: str, partition_by: list[str], trigger):
    """Start ``df``'s streaming write into ``fmt`` at ``output`` (``trigger``: the writer's
    trigger keyword arguments). Exactly once: Spark's file sink (parquet) and Delta's and
    Iceberg's streaming sinks each commit a micro-batch once by its batch id, and the nsq source
    makes a batch run again the same batch."""
    w = df.writeStream.option("checkpointLocation", checkpoint).trigger(**trigger)
    if fmt in ("parquet", "delta"):
        return w.format(fmt).option("path", location(output) if fmt == "delta" else output) \
            .partitionBy(*partition_by).start()
    table = iceberg_table(output)
    cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in df.schema.fields)
    parts = f" PARTITIONED BY ({', '.join(f'`{c}`' for c in partition_by)})" if partition_by else ""
    spark.sql(f"CREATE TABLE IF NOT EXISTS {table} ({cols}) USING iceberg{parts}")
    # fanout: a task writes rows of several partitions in any order (they are not sorted by them)
    return w.format("iceberg").option("fanout-enabled", "true").toTable(table)
