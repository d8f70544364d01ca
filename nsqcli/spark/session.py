"""A SparkSession for nsqcli's Spark commands (replay, query, to-parquet).

- ``local[*]`` by default; ``master`` may be ``spark://``, ``yarn``, ``k8s://``...; ``remote`` is
  Spark Connect (``sc://``), whose server must have nsqcli installed.
- Workers run this Python (``PYSPARK_PYTHON``); in local mode Spark stays on 127.0.0.1.
- Spark's console noise (JVM start-up banner, log4j) goes to a log file unless ``verbose``: the
  JVM inherits stderr when it starts, so stderr is pointed at the file for that moment only.
- On a cluster nsqcli ships itself to the executors (``ship``) unless ``py_files`` are given.
"""

from __future__ import annotations

import os
import sys
import tempfile


def require(connect: bool = False) -> None:
    """ImportError (naming the module) unless pyspark and pyarrow are installed; with
    ``connect``, also the Spark Connect client's packages (pandas, grpcio...)."""
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401

    if connect:  # pyspark.sql.connect.utils.check_dependencies without its doctest exit(0)
        from pyspark.sql.connect import utils as cu
        from pyspark.sql.pandas.utils import require_minimum_pandas_version

        require_minimum_pandas_version()  # PySparkImportError (an ImportError) naming the package
        for check in ("grpc", "grpcio_status", "googleapis_common_protos", "zstandard"):
            getattr(cu, f"require_minimum_{check}_version", lambda: None)()


def is_local(master: str | None) -> bool:
    return not master or master.startswith("local")


def build(app_name: str, master: str | None = None, remote: str | None = None, confs: dict | None = None,
          log_level: str = "ERROR", py_files: tuple = (), verbose: bool = False):
    """The session, ready for ``format("nsq")`` (registered) and nsqcli on every executor.
    Returns (session, log path or None)."""
    require(connect=bool(remote))
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = None if remote else (master or "local[*]")
    if is_local(master) and not remote:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    builder = builder.remote(remote) if remote else builder.master(master)
    defaults = {"spark.sql.session.timeZone": "UTC"}
    if not remote:  # a Connect client may set session (SQL) confs only: the server owns the rest
        defaults["spark.ui.showConsoleProgress"] = "false"
    if is_local(master) and not remote:
        # Spark's 200 shuffle partitions make every stateful micro-batch (to-parquet --dedupe)
        # run 200 tiny tasks on one machine
        defaults.update({"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
                         "spark.sql.shuffle.partitions": str(2 * (os.cpu_count() or 2))})
    for k, v in {**defaults, **(confs or {})}.items():
        builder = builder.config(k, v)
    log_path = None
    if verbose:
        spark = builder.getOrCreate()
    else:
        fd, log_path = tempfile.mkstemp(prefix="nsqcli-spark-", suffix=".log")
        saved = os.dup(2)
        try:
            os.dup2(fd, 2)  # the JVM (and its Python workers) keep this stderr
            spark = builder.getOrCreate()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(fd)
    if not remote:
        spark.sparkContext.setLogLevel(log_level)
    if not verbose:  # PySpark also logs each SQL error (with the JVM stack) on the driver's stderr
        import logging
        logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL + 1)
    from . import register, ship

    register(spark)
    if not remote:
        for f in py_files:
            spark.sparkContext.addPyFile(f)
        if not py_files:
            ship(spark)
    return spark, log_path


def is_connect(spark) -> bool:
    """Is this a Spark Connect session (``sc://``), rather than a driver in this process?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def first_line(error: BaseException) -> str:
    """Spark's message for an error in one line, without JVM stacks: for an exception raised in a
    Python worker, that exception's own message (e.g. the sink's "published 0 of 10 ...")."""
    import re

    text = getattr(error, "getMessage", None)
    text = str(text() if callable(text) else error)
    if "Traceback (most recent call last)" in text:
        raised = [m.group(2) for m in re.finditer(r"(?m)^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$", text)]
        if raised:
            return raised[-1].strip()
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return type(error).__name__
