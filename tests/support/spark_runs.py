"""Spark commands (`replay`, `query`, `to-parquet`) run in the test's own process, sharing one
JVM: each run makes a SparkContext of its own in it (about a second) where a subprocess pays a
JVM launch (~10 CPU-s, more with table jars). The JVM is launched by the first run, with that
run's confs (spark.jars.packages is read at launch), and :func:`shutdown_jvm` ends it, so that
a later test's session or run gets a JVM with its own jars and options.

A run goes to a subprocess - the real executable - when a SparkContext of another test is alive
in this process (the session fixture's), and when ``real`` asks for it (a few runs of each
command prove the executable behaves the same). tests/conftest.py puts the files using this on
xdist workers of their own, away from the session fixture's tests."""

from __future__ import annotations

import contextlib
import subprocess

from tests.support.helpers import NSQCLI, clean_env

_jvm = {"ours": False}  # a run here launched the process's JVM


def nsqcli(args, timeout=180, real=False) -> subprocess.CompletedProcess:
    """A command's run as the real executable gives it: exit code, stdout and stderr as text.
    ``timeout`` bounds a subprocess; in this process pytest-timeout bounds the test."""
    if real or not may_share_a_jvm():
        return subprocess.run(NSQCLI + list(args), capture_output=True, text=True, timeout=timeout,
                              env=clean_env())
    from tests.support.inprocess import run_in_process

    with _here():
        r = run_in_process(args, may_stay=lambda t: type(t).__module__.startswith(("py4j.", "pyspark.")))
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def session(builder):
    """``builder.getOrCreate()`` in this process, on the runs' JVM (launching it as a run would when
    there is none): a test driving Spark itself between runs. Stop it before the next run."""
    assert may_share_a_jvm(), "a SparkContext of another test is alive in this process"
    with _here():
        return builder.getOrCreate()


@contextlib.contextmanager
def _here():
    """Spark used in this process: a JVM launched meanwhile is the runs' (shutdown_jvm ends it)."""
    from pyspark import SparkContext

    launching = SparkContext._gateway is None
    try:
        yield
    finally:
        _jvm["ours"] = _jvm["ours"] or (launching and SparkContext._gateway is not None)


def launched_here() -> bool:
    """A run here launched this process's JVM, and it is still up (a session made now shares it)."""
    return _jvm["ours"]


def may_share_a_jvm() -> bool:
    from pyspark import SparkContext

    return SparkContext._active_spark_context is None and (SparkContext._gateway is None or _jvm["ours"])


def shutdown_jvm() -> None:
    """End the JVM the runs here launched (nothing when they launched none)."""
    if not _jvm["ours"]:
        return
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None:  # a session the test made on the runs' JVM (reading their output back)
        active.stop()
    gateway, _jvm["ours"] = SparkContext._gateway, False
    SparkContext._gateway = SparkContext._jvm = None
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    finally:
        if proc is not None:  # pyspark's gateway JVM exits at EOF on its stdin
            proc.stdin.close()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:  # (not left running for the next test's JVM)
                proc.kill()
                proc.wait(10)
