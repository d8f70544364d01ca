"""`nsqcli to-parquet --format delta|iceberg`: the real CLI against a real nsqd. Where the
installed pyspark has a working jar (README "Tables": 4.0/4.1/4.2 for Delta, 4.0/4.1 for
Iceberg) the table is written for real, the command killed -9 mid-stream (the executable, with
its JVM) and resumed (in this process: tests/support/spark_runs.py), and read back with Spark
(on the resumed run's JVM, its jars loaded at launch) and with delta-rs / pyiceberg (the
`tables-test` extra); where it has none (4.3) the one-line refusal is what is asserted. Never
skipped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest
from tests.support.helpers import NSQCLI, channel_stats, clean_env, wait_for
from tests.support.spark_runs import launched_here, nsqcli, shutdown_jvm
from tests.spark.test_datasource import publish

from nsqcli.spark import tables

PYSPARK = metadata.version("pyspark")
SPARK = ["--master", "local[2]"]


@pytest.fixture(autouse=True)
def _own_jvm():
    """A table's jars are read at a JVM's launch: each test's runs get a JVM of their own."""
    yield
    shutdown_jvm()


def assert_refused(fmt, r, ck) -> None:
    """No jar for this Spark: one line naming a pyspark and jar that work, before any JVM."""
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr
    name = "Delta Lake" if fmt == "delta" else "Iceberg"
    assert r.stderr.startswith(f"nsqcli: error: --format {fmt}: no {name} release works with Spark {PYSPARK}")
    table = tables.DELTA if fmt == "delta" else tables.ICEBERG
    newest = max(table, key=lambda m: tuple(map(int, m.split("."))))
    assert f"pip install 'pyspark=={tables.MEASURED_PYSPARK[newest]}'" in r.stderr and table[newest] in r.stderr
    assert not ck.exists()  # Spark never started


def killed_then_resumed(fmt, nsqd, topic, tmp_path) -> tuple[set, object, object]:
    """2000 numbered messages streamed into the table, the command killed -9 (with its JVM)
    after two committed batches, 500 more published, then resumed with --available-now.
    Returns (the bodies published, output, the last run's result)."""
    out, ck = tmp_path / "lake" / "events", tmp_path / "ck"
    base = ["to-parquet", "-t", topic, "-o", str(out), "--checkpoint", str(ck), "--format", fmt,
            "--nsqd-tcp-address", nsqd.tcp_address, "--nsqd-http-address", nsqd.http_address, *SPARK,
            "--msg-timeout", "5s"]
    first = [b"%s-%05d" % (fmt.encode(), i) for i in range(2000)]
    publish(nsqd, topic, first)
    p = subprocess.Popen(NSQCLI + base + ["--trigger", "0", "--max-messages-per-batch", "200"],
                         env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        commits = ck / "commits"
        wait_for(lambda: p.poll() is not None
                 or (commits.exists() and len([f for f in commits.iterdir() if f.name.isdigit()]) >= 2),
                 240, interval=0.1, what="two committed batches")
        assert p.poll() is None, p.stderr.read().decode()
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the CLI and its JVM: a driver lost mid-batch
        p.wait(30)
        p.stderr.close()
    second = [b"%s-%05d" % (fmt.encode(), i) for i in range(2000, 2500)]
    publish(nsqd, topic, second)
    # what the killed run held in flight comes back to the channel after its msg_timeout (5 s)
    wait_for(lambda: channel_stats(nsqd, topic, "nsqcli_to_parquet")["in_flight_count"] == 0, 30,
             interval=0.2, what="the killed run's messages back in the channel")
    # on Spark < 4.2 one batch per query start, the interrupted one first: --available-now starts
    # the query again until the channel is drained
    r = nsqcli(base + ["--available-now"], timeout=300)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    ch = channel_stats(nsqd, topic, "nsqcli_to_parquet")
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0
    return set(first + second), out, r


def spark_read(fmt: str, out) -> list[bytes]:
    """The table's bodies as Spark reads it, with the same jar (path-based for both): on the JVM
    the resumed run launched here, else (it ran as a subprocess) a JVM of its own."""
    confs = dict(kv.split("=", 1) for kv in tables.session_confs(fmt, PYSPARK, str(out)))
    if launched_here():
        from pyspark.sql import SparkSession

        b = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
        for k, v in confs.items():
            b = b.config(k, v)
        spark = b.getOrCreate()
        try:
            return [bytes(r.body) for r in spark.read.format(fmt).load(str(out)).select("body").collect()]
        finally:
            spark.stop()
    code = textwrap.dedent(f"""
        import json, os, sys
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        from pyspark.sql import SparkSession
        b = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
        for k, v in {confs!r}.items():
            b = b.config(k, v)
        spark = b.getOrCreate()
        rows = spark.read.format({fmt!r}).load({str(out)!r}).select("body").collect()
        print(json.dumps([bytes(r.body).decode() for r in rows]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=clean_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return [s.encode() for s in json.loads(r.stdout.strip().splitlines()[-1])]


@pytest.mark.spark
@pytest.mark.spark_lts
@pytest.mark.timeout(420)
def test_delta_table_exactly_once_across_a_kill(nsqd, topic, tmp_path):
    if tables.package("delta", PYSPARK) is None:
        return assert_refused("delta", nsqcli(["to-parquet", "-t", topic, "-o", str(tmp_path / "t"), "--checkpoint",
                                               str(tmp_path / "ck"), "--format", "delta", *SPARK]), tmp_path / "ck")
    bodies, out, r = killed_then_resumed("delta", nsqd, topic, tmp_path)
    assert f"written to the Delta Lake table {out}" in r.stderr
    from deltalake import DeltaTable

    t = DeltaTable(str(out))
    got = t.to_pyarrow_table().column("body").to_pylist()
    assert set(got) == bodies and len(got) == len(bodies)  # every message, none twice
    assert t.metadata().partition_columns == ["topic", "date"]
    assert (out / f"topic={topic}").is_dir()
    got = spark_read("delta", out)
    assert set(got) == bodies and len(got) == len(bodies)


@pytest.mark.spark
@pytest.mark.spark_lts
@pytest.mark.timeout(420)
def test_iceberg_table_exactly_once_across_a_kill(nsqd, topic, tmp_path):
    if tables.package("iceberg", PYSPARK) is None:
        return assert_refused("iceberg", nsqcli(["to-parquet", "-t", topic, "-o", str(tmp_path / "t"), "--checkpoint",
                                                 str(tmp_path / "ck"), "--format", "iceberg", *SPARK]), tmp_path / "ck")
    bodies, out, r = killed_then_resumed("iceberg", nsqd, topic, tmp_path)
    assert f"written to the Iceberg table {out}" in r.stderr
    from pyiceberg.table import StaticTable

    version = (out / "metadata" / "version-hint.text").read_text().strip()
    t = StaticTable.from_metadata(str(out / "metadata" / f"v{version}.metadata.json"))
    got = t.scan().to_arrow().column("body").to_pylist()
    assert set(got) == bodies and len(got) == len(bodies)  # every message, none twice
    assert [f.name for f in t.spec().fields] == ["topic", "date"]
    assert (out / "data" / f"topic={topic}").is_dir()
    got = spark_read("iceberg", out)
    assert set(got) == bodies and len(got) == len(bodies)


# -- no JVM ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,version,refused", [
    ("delta", "4.0.5", False), ("delta", "4.1.4", False), ("delta", "4.2.1", False), ("delta", "4.3.0", True),
    ("iceberg", "4.0.5", False), ("iceberg", "4.1.4", False), ("iceberg", "4.2.1", True),
    ("iceberg", "4.3.0", True), ("parquet", "4.3.0", False)])
def test_the_measured_matrix_refuses_in_one_line_naming_what_works(fmt, version, refused):
    why = tables.refusal(fmt, version)
    assert (why is not None) == refused
    if refused:
        assert "\n" not in why and why.startswith(f"--format {fmt}: no ")
        working = tables.DELTA["4.2"] if fmt == "delta" else tables.ICEBERG["4.1"]
        assert working in why and "pip install 'pyspark==4." in why
    # a jar the user brings is theirs to vouch for
    assert tables.refusal(fmt, version, {"spark.jars.packages": "io.delta:delta-spark_4.3_2.13:9.0.0,"
                                         "org.apache.iceberg:iceberg-spark-runtime-4.3_2.13:2.0.0"}) is None


def test_session_confs_join_the_users_packages_and_let_theirs_win():
    confs = dict(kv.split("=", 1) for kv in tables.session_confs(
        "iceberg", "4.1.4", "/lake/events/", ("spark.jars.packages=org.apache.hadoop:hadoop-aws:3.4.1",
                                               "spark.sql.catalog.nsqcli.type=hadoop")))
    assert confs["spark.jars.packages"] == f"{tables.ICEBERG['4.1']},org.apache.hadoop:hadoop-aws:3.4.1"
    assert confs["spark.sql.catalog.nsqcli.warehouse"] == "/lake"  # --output is the table itself
    assert tables.iceberg_table("/lake/events/") == "nsqcli.`events`"
    confs = dict(kv.split("=", 1) for kv in tables.session_confs(
        "delta", "4.2.1", "s3a://b/t", ("spark.jars.packages=io.delta:delta-spark_2.13:4.0.1",)))
    assert confs["spark.jars.packages"] == "io.delta:delta-spark_2.13:4.0.1"  # their Delta, not ours too
    assert confs["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    remote = dict(kv.split("=", 1) for kv in tables.session_confs("delta", None, "/t", (), remote=True))
    assert remote == {}  # a Connect server's jars and static confs are its own


@pytest.mark.spark
def test_an_output_holding_another_format_is_refused_before_spark(tmp_path):
    (tmp_path / "t" / "_delta_log").mkdir(parents=True)
    r = nsqcli(["to-parquet", "-t", "x", "-o", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "ck"), *SPARK])
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"nsqcli: error: --output {tmp_path / 't'} holds a Delta Lake table, not a "
                               "Parquet dataset: give --format delta")
    assert not (tmp_path / "ck").exists()
