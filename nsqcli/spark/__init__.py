"""NSQ for PySpark (the ``nsqcli[spark]`` extra): a data source named "nsq" and archive reading.

    from nsqcli.spark import register, read_archive
    register(spark)                                   # once per SparkSession
    df.write.format("nsq").option("topic", "events").option("nsqdTCPAddresses", "...").save()
    stream = spark.readStream.format("nsq").option("topic", "events").option(...).load()
    archived = read_archive(spark, "/archive/events/")

Nothing outside this package imports pyspark; importing it without the extra says what to install.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec

try:
    import pyspark  # noqa: F401
except ModuleNotFoundError as e:  # pragma: no cover - exercised by the CLI's "missing extra" error
    raise ModuleNotFoundError(f"nsqcli.spark needs the spark extra: pip install 'nsqcli[spark]' ({e})",
                              name=e.name) from e
# pyarrow is looked for, not imported: every Python process Spark starts for the data source
# (creating it, planning a read, each streaming query's runner, each task) imports this package,
# and most never touch pyarrow, which costs them ~0.1 s of CPU (with numpy) each
if sys.modules.get("pyarrow") is None and find_spec("pyarrow") is None:  # pragma: no cover - as above
    raise ModuleNotFoundError("nsqcli.spark needs the spark extra: pip install 'nsqcli[spark]' "
                              "(No module named 'pyarrow')", name="pyarrow")


def register(spark) -> None:
    """Register the "nsq" data source with this SparkSession."""
    from .datasource import NSQDataSource
    spark.dataSource.register(NSQDataSource)


def ship(spark, force: bool = False):
    """Make nsqcli importable on a cluster's executors (see nsqcli.spark.shipping)."""
    from .shipping import ship as _ship
    return _ship(spark, force)


def read_archive(spark, path, stream: bool = False, **kwargs):
    """A DataFrame over to-file / nsq_to_file archives (see nsqcli.spark.archive)."""
    from .archive import read_archive as _read
    return _read(spark, path, stream=stream, **kwargs)


__all__ = ["register", "read_archive", "ship"]
