"""What the installed pyspark can do with nsqcli, from its version alone (package metadata:
pyspark is never imported here - nor nsqcli.spark, which imports it - so ``nsqcli version`` and
``doctor`` stay fast).

The Python Data Source API came with Spark 4.0; 4.1 added Arrow stream writers; 4.2 admission
control (``latestOffset(start, limit)``, ReadLimit) and Trigger.AvailableNow for Python sources.
"""

from __future__ import annotations

SUPPORTED = ">=4.0,<5"  # the spark extra's range (pyproject.toml)


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
    return out


def source_available_now_in_batches(version: str | None) -> bool:
    v = parse(version)
    return v is not None and v >= (4, 2)
