"""What the installed pyspark can do with nsqcli, from its version alone (package metadata:
pyspark is never imported here - nor nsqcli.spark, which imports it - so ``nsqcli version`` and
``doctor`` stay fast).

The Python Data Source API came with Spark 4.0; 4.1 added Arrow stream writers; 4.2 admission
control (``latestOffset(start, limit)``, ReadLimit) and Trigger.AvailableNow for Python sources.
"""

from __future__ import annotations

SUPPORTED = ">=4.0,<5"  # the spark extra's range (pyproject.toml)

# Spark minor -> the Maven coordinates measured to write, then read back, a partitioned table
# from a streaming query (and pyspark's newest patch release that was measured with it). Delta's
# artifacts are built per Spark minor since Delta 4.1 (delta-spark_<minor>_2.13), Iceberg's
# runtime per Spark minor (iceberg-spark-runtime-<minor>_2.13). Not listed, as measured:
#   Delta on Spark 4.3: no build; the 4.2 jar commits, then reading fails (NoSuchMethodError
#     LogicalRDD.<init>).
#   Iceberg on Spark 4.2 and 4.3: no runtime; the 4.1 runtime (1.12.0) fails at CREATE TABLE
#     (IncompatibleClassChangeError: SparkView ... View is not an interface).
DELTA = {
    "4.0": "io.delta:delta-spark_4.0_2.13:4.4.0",
    "4.1": "io.delta:delta-spark_4.1_2.13:4.4.0",
    "4.2": "io.delta:delta-spark_4.2_2.13:4.4.0",
}
ICEBERG = {
    "4.0": "org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.11.0",
    "4.1": "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0",
}
MEASURED_PYSPARK = {"4.0": "4.0.5", "4.1": "4.1.4", "4.2": "4.2.1"}


def parse(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (int(x) for x in (version or "").split(".")[:2])
    except ValueError:
        return None
    return major, minor


def installed() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None


def features(version: str | None) -> dict[str, str]:
    """feature -> what this pyspark does with it (one line each); {} when not installed."""
    v = parse(version)
    if v is None:
        return {}
    if not (4, 0) <= v < (5, 0):
        return {"nsqcli.spark": f"not supported: pyspark {version} (nsqcli[spark] needs pyspark{SUPPORTED}; "
                                "the Python Data Source API came with Spark 4.0)"}
    out = {"nsq source": "exactly once (spool + checkpoint)",
           "availableNow": ("drains in batches of maxMessagesPerBatch" if v >= (4, 2) else
                            "one batch per start (admission control needs pyspark >= 4.2); "
                            "to-parquet --available-now starts it again until the channel is drained"),
           "nsq sink": "batch and streaming" + ("" if v >= (4, 1) else " (streaming rows, not Arrow: slower)")}
    minor = f"{v[0]}.{v[1]}"
    for name, table in (("Delta Lake", DELTA), ("Iceberg", ICEBERG)):
        jar = table.get(minor)
        out[name] = (f"to-parquet --format {name.split()[0].lower()} ({jar})" if jar else
                     f"no release works with Spark {minor} (one does with Spark {', '.join(sorted(table))}: "
                     "README, Tables)")
    return out


def source_available_now_in_batches(version: str | None) -> bool:
    v = parse(version)
    return v is not None and v >= (4, 2)
