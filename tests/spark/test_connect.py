"""nsqcli.spark through Spark Connect: a REAL Connect server started from the pip package
(spark-submit ... SparkConnectServer, local[2], 127.0.0.1, a free port), once per test session,
stopped by its pid after this module. Its Python workers import nsqcli from this checkout
(PYTHONPATH).

The clients are separate processes (a driver script, or the nsqcli CLI with --remote): a Connect
client in the pytest process would switch pyspark into Connect mode for the whole process
(SPARK_CONNECT_MODE_ENABLED), under the other tests' local SparkSession. Clients run in their own
working and temporary directories, the server in others. Both still share one filesystem here, so
a count passed through a file would not be caught by these tests alone; replay and to-parquet
pass none (their counts are query results and progress objects). The sink's commitReportPath is
such a file on purpose: a Connect client reads it where the server's driver wrote it (a path
both see).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import NSQCLI, channel_stats, clean_env, topic_stats, wait_for
from tests.spark.test_datasource import publish

# JVM launches (the Connect server's, its Python workers') take 20-40 s each on a saturated CI machine
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent.parent


class ConnectServer:
    def __init__(self, url: str, pid: int, log: Path):
        self.url, self.pid, self.log = url, pid, log

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server (local[2]) from the pip package; its pid is ours to stop. Only this
    module uses it, so module scope starts it once per test session and stops it (~1 GB of JVM)
    before the other Spark tests run."""
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java is missing: the Spark tests need a JDK 17 on PATH (or JAVA_HOME)", pytrace=False)
    try:
        import pyspark
    except ImportError as e:
        pytest.fail(f"the Spark tests need the spark extra: pip install -e '.[spark]' ({e})", pytrace=False)
    from nsqcli.sandbox import _die_with_parent, free_port

    base = tmp_path_factory.mktemp("connect-server")
    cwd, tmp = base / "cwd", base / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    port = free_port()
    env = clean_env({"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmp),
                     "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)})
    confs = {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port),
             "spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false", "spark.driver.memory": "1g",
             "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "2",
             "spark.local.dir": str(tmp), "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmp}"}
    cmd = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", "local[2]",
           "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "nsqcli-connect-tests"]
    for k, v in confs.items():
        cmd += ["--conf", f"{k}={v}"]
    log_path = base / "server.log"
    with open(log_path, "wb") as log:  # spark-class execs java: the pid is the server's JVM
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    server = ConnectServer(f"sc://127.0.0.1:{port}", proc.pid, log_path)
    try:
        def listening():
            if proc.poll() is not None:
                raise AssertionError(f"the Connect server exited ({proc.returncode}):\n{server.log_tail()}")
            with socket.socket() as s:
                s.settimeout(0.5)
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening, 90, interval=0.2, what="the Spark Connect server's port")
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def client_dir(tmp_path):
    """The client's own working directory and TMPDIR (not the server's)."""
    d = tmp_path / "client"
    (d / "tmp").mkdir(parents=True)
    return d


def run_client(args, client_dir, timeout=180):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=client_dir,
                          env=clean_env({"TMPDIR": str(client_dir / "tmp")}))


def nsqcli(args, connect_server, client_dir, timeout=180):
    return run_client(NSQCLI + list(args) + ["--remote", connect_server.url], client_dir, timeout)


def last_line(r) -> str:
    return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


def raw_archive(path: Path, lines: list[bytes]) -> Path:
    """A raw (one message per line) archive named like nsq_to_file's output."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "src.node-2.2026-11-22_10.log").write_bytes(b"".join(line + b"\n" for line in lines))
    return path


# -- the data source from a Connect client --------------------------------------------------------
DRIVER = r'''
import json, sys
from pyspark.sql import SparkSession
url, nsqd, topic, out_topic, checkpoint, nsqd_http, report = sys.argv[1:8]
spark = SparkSession.builder.remote(url).getOrCreate()
import nsqcli.spark
nsqcli.spark.register(spark)
df = spark.range(0, 3000, 1, 3).selectExpr("concat('c-', cast(id as string)) as body")  # 3 tasks
df.write.format("nsq").option("nsqdTCPAddresses", nsqd).option("topic", topic) \
    .option("commitReportPath", report).mode("append").save()
written = json.load(open(report))  # the sink's totals: written by the server's driver, read here
stream = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", nsqd_http).option("topic", topic)
          .option("channel", "relay").option("maxMessagesPerBatch", "1000")
          .option("spoolLocation", checkpoint + "/spool").load())
q = (stream.select("body").writeStream.format("nsq").option("nsqdTCPAddresses", nsqd)
     .option("topic", out_topic).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
q.awaitTermination(150)
error = q.exception()
print("RESULT " + json.dumps({"error": str(error) if error else None, "active": q.isActive,
                              "rows": [p.numInputRows for p in q.recentProgress], "written": written}), flush=True)
spark.stop()
'''


@pytest.mark.timeout(360)  # also the Connect server's start
def test_nsq_sink_and_source_from_a_connect_client(connect_server, nsqd, topic, client_dir, tmp_path):
    """Batch write through Connect, then a stream nsq -> nsq (AvailableNow, 1000 per batch)."""
    script = client_dir / "driver.py"
    script.write_text(DRIVER)
    out_topic = topic + "_out"
    r = run_client([sys.executable, str(script), connect_server.url, nsqd.tcp_address, topic, out_topic,
                    str(tmp_path / "checkpoint"), nsqd.http_address, str(tmp_path / "report.json")], client_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["error"] is None and not result["active"]
    assert sum(result["rows"]) == 3000 and max(result["rows"]) <= 1000, result["rows"]
    written = result["written"]  # the commit report, read by the client
    assert (written["state"], written["published"], written["acknowledged"], written["exact"]) == (
        "committed", 3000, 3000, True)
    assert sorted(p["messages"] for p in written["partitions"]) == [1000, 1000, 1000]
    assert written["line"].startswith("nsqcli.spark: write committed: published 3000 messages (")
    assert topic_stats(nsqd, topic)["message_count"] == 3000  # the batch write, exactly
    assert topic_stats(nsqd, out_topic)["message_count"] == 3000  # the stream, exactly
    relay = channel_stats(nsqd, topic, "relay")
    assert relay["depth"] == 0 and relay["in_flight_count"] == 0  # every message FINed


# -- the CLI with --remote ------------------------------------------------------------------------
def test_replay_remote_prints_what_nsqd_acknowledged(connect_server, nsqd, topic, client_dir, tmp_path):
    archive = raw_archive(tmp_path / "archive", [b"line %d" % i for i in range(700)])
    r = nsqcli(["replay", str(archive), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address],
               connect_server, client_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_line(r).startswith(f"nsqcli: replayed 700 messages into {topic} in "), r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == 700
    r = nsqcli(["replay", str(archive), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--json",
                "--where", "body_text not like '%9'", "--rate", "20000"], connect_server, client_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["published"] == 630 and doc["topic"] == topic and doc["dry_run"] is False
    assert topic_stats(nsqd, topic)["message_count"] == 1330
    assert not list((client_dir / "tmp").iterdir())  # nothing left behind on the client


def test_replay_remote_failures_say_what_nsqd_acknowledged(connect_server, nsqd_factory, topic, client_dir,
                                                             tmp_path):
    """nsqd refuses message 301 (too big): the task stops there, the count is exact."""
    small = nsqd_factory(max_msg_size=64)
    lines = [b"short %d" % i for i in range(300)] + [b"x" * 200] + [b"after %d" % i for i in range(199)]
    archive = raw_archive(tmp_path / "archive", lines)
    r = nsqcli(["replay", str(archive), "-t", topic, "--nsqd-tcp-address", small.tcp_address],
               connect_server, client_dir)
    assert r.returncode == 1, r.stderr[-2000:]
    last = last_line(r)
    assert last.startswith("nsqcli: error: nsq sink, partition 0: published 300 of 500 messages: "
                           "message 301 (200 bytes) refused by nsqd"), last
    assert "; nsqd acknowledged 300 messages (1 of 1 tasks stopped early" in last
    assert "Traceback" not in r.stderr
    assert topic_stats(small, topic)["message_count"] == 300
    # through Connect a bad --where surfaces only when the job runs: still Spark's line, exit 2
    r = nsqcli(["replay", str(archive), "-t", topic, "--nsqd-tcp-address", small.tcp_address, "--where", "nope = 1"],
               connect_server, client_dir)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "UNRESOLVED_COLUMN" in r.stderr, r.stderr
    assert topic_stats(small, topic)["message_count"] == 300


def test_query_remote(connect_server, client_dir, tmp_path):
    """A JSON archive: its format is detected where Spark reads it (the server's files)."""
    from nsqcli.records import envelope

    class M:  # the fields envelope() reads
        def __init__(self, i):
            self.topic, self.channel, self.nsqd = "arch", "c", "10.0.0.9:4150"
            self.id, self.body, self.timestamp, self.attempts = b"%016x" % i, b"a%d" % i, 1_795_000_000_000_000_000, 1

    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "arch.node-1.2026-11-22_09.log").write_text(
        "".join(json.dumps(envelope(M(i))) + "\n" for i in range(500)))
    r = nsqcli(["query", "select host, nsqd, count(*) as n from messages group by host, nsqd", "-a", str(archive),
                "--json"], connect_server, client_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"host": "node-1", "nsqd": "10.0.0.9:4150",
                                                                     "n": 500}]
    # the archive paths are the server's: a missing one is Spark's one-line error, exit 2
    r = nsqcli(["query", "select 1", "-a", str(tmp_path / "missing")], connect_server, client_dir)
    assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("nsqcli: error: [PATH_NOT_FOUND]"), r.stderr


def test_to_parquet_remote_available_now_counts_rows(connect_server, nsqd, topic, client_dir, tmp_path):
    bodies = {b"pq-%d" % i for i in range(1500)}
    publish(nsqd, topic, sorted(bodies))
    out, ck = tmp_path / "out", tmp_path / "ck"
    r = nsqcli(["to-parquet", "-t", topic, "-o", str(out), "--checkpoint", str(ck), "--available-now",
                "--nsqd-tcp-address", nsqd.tcp_address, "--max-messages-per-batch", "500"],
               connect_server, client_dir, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_line(r).startswith("nsqcli: to-parquet: 1500 rows in "), r.stderr
    assert last_line(r).endswith(f" written to the Parquet dataset {out}")
    import pyarrow.dataset as ds
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 1500 and set(table.column("body").to_pylist()) == bodies
    ch = channel_stats(nsqd, topic, "nsqcli_to_parquet")
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0  # FINed before the command returned
