"""nsqcli.spark on a REAL standalone Spark cluster: a master and a worker started from the pip
package (spark-class ... Master / Worker) on 127.0.0.1, executors in their own JVMs, nsqcli shipped
to them with nsqcli.spark.ship(). The sink, the archive reader and the source's tasks run there;
the drivers (the tests' sessions, `replay`, `query`) share one JVM in this process. Every process
this test starts is stopped by its pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.helpers import channel_stats, clean_env, http_post, topic_stats, wait_for
from tests.support.spark_runs import may_share_a_jvm, nsqcli, session, shutdown_jvm

# a JVM launch takes 20-40 s on a saturated 2-core CI machine, and a pytest-timeout inside a py4j
# call breaks this process's gateway for the tests after it: bounds for launches, not for work
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def free_port() -> int:
    from nsqcli.sandbox import free_port as fp
    return fp()


def spark_class() -> str:
    try:
        import pyspark
    except ImportError as e:
        pytest.fail(f"the Spark tests need the spark extra: pip install -e '.[spark]' ({e})", pytrace=False)
    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import shutil
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java is missing: the Spark tests need a JDK 17 on PATH (or JAVA_HOME)", pytrace=False)
    base = tmp_path_factory.mktemp("cluster")
    env = clean_env({"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                     "SPARK_LOG_DIR": str(base), "SPARK_WORKER_DIR": str(base / "work"),
                     # the master and worker start as the tests' drivers do (tests/conftest.py)
                     "SPARK_DAEMON_JAVA_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", "")})
    ports: set[int] = set()
    while len(ports) < 3:  # three distinct ports (a released port can come back at once)
        ports.add(free_port())
    port, ui, wui = sorted(ports)
    procs = []
    logs = []
    try:
        for name, args in (
            ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                        "--webui-port", str(ui)]),
            ("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
                        "--memory", "2g", "--webui-port", str(wui), "--work-dir", str(base / "work"),
                        f"spark://127.0.0.1:{port}"]),
        ):
            log = open(base / f"{name}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen([spark_class()] + args, env=env, stdout=log, stderr=subprocess.STDOUT))

        def alive_workers():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    return json.loads(r.read()).get("aliveworkers", 0)
            except OSError:
                return 0
        wait_for(alive_workers, 90, interval=0.5, what="a standalone master with one alive worker")
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in reversed(procs):  # worker first (it stops its executors), then the master
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()


@pytest.fixture(scope="module", autouse=True)
def _shared_jvm():
    """The tests drive Spark from this process and run `replay` and `query` in it: one driver
    JVM for the module (tests/support/spark_runs.py), ended with it. Executors are the cluster's."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)  # (the sessions set spark.pyspark.python too)
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        yield
        shutdown_jvm()


def on_a_driver(master: str, job, *args: str) -> dict:
    """``job(spark, shipped, *args)`` on a SparkSession of the cluster (``shipped``: nsqcli's zip
    for the executors) and its result, with the driver's pid. The driver is this process, on the
    module's JVM; in a run without xdist, where the session fixture's SparkContext may be alive
    here, it is a process of its own running the same job (``python -m tests.spark.test_cluster``)."""
    if not may_share_a_jvm():
        r = subprocess.run([sys.executable, "-m", "tests.spark.test_cluster", master, job.__name__, *args],
                           cwd=Path(__file__).parents[2], env=clean_env(), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
    from pyspark.sql import SparkSession

    import nsqcli.spark

    spark = session(SparkSession.builder.master(master).appName(f"nsqcli-{job.__name__}")
                    .config("spark.pyspark.python", sys.executable).config("spark.driver.host", "127.0.0.1")
                    .config("spark.executor.memory", "1g").config("spark.ui.enabled", "false")
                    .config("spark.ui.showConsoleProgress", "false"))
    try:
        spark.sparkContext.setLogLevel("ERROR")
        shipped = nsqcli.spark.ship(spark)
        nsqcli.spark.register(spark)
        return dict(job(spark, shipped, *args), driver_pid=os.getpid())
    finally:
        spark.stop()


def sink_job(spark, shipped, nsqd, topic, archive) -> dict:
    """Where the tasks run (under an executor JVM or the driver's) and import nsqcli from; 20,000
    rows written to ``topic``; the archive read and counted."""
    import nsqcli.spark

    def where_it_runs(_):  # (in a task: only builtins and its own imports; pickled by value)
        import os

        import nsqcli
        lines, pid = [], os.getpid()
        while pid > 1:  # the command lines of the task's process and its ancestors
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    lines.append(f.read().decode(errors="replace"))
                with open(f"/proc/{pid}/status") as f:
                    pid = int(next(x for x in f if x.startswith("PPid:")).split()[1])
            except OSError:
                break
        return (nsqcli.__file__, any("CoarseGrainedExecutorBackend" in x for x in lines),
                any("SparkSubmit" in x for x in lines))

    where = spark.sparkContext.parallelize(range(4), 4).map(where_it_runs).collect()
    df = spark.range(20000).selectExpr("concat('c-', cast(id as string)) as body").repartition(4)
    df.write.format("nsq").option("nsqdTCPAddresses", nsqd).option("topic", topic).mode("append").save()
    rows = nsqcli.spark.read_archive(spark, archive).groupBy("topic", "host", "nsqd").count().collect()
    return {"shipped": shipped, "where": where, "archive": [r.asDict() for r in rows]}


def source_job(spark, shipped, http, topic, out) -> dict:
    """``topic`` streamed into parquet (available-now) and counted back; each task's END marker in
    the spool, with the command lines of its process's ancestors."""
    q = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", http).option("topic", topic)
         .option("maxMessagesPerPartition", "2000").option("spoolLocation", out + "/ck/spool").load()
         .writeStream.format("parquet").option("path", out + "/parquet").option("checkpointLocation", out + "/ck")
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    error = q.exception()
    ends = [json.loads(f.read_bytes()) for f in Path(out, "ck", "spool").rglob("*")
            if f.is_file() and f.read_bytes()[:1] == b"{"]
    return {"error": str(error) if error else None, "rows": spark.read.parquet(out + "/parquet").count(),
            "tasks": [{"rows": e["rows"], "pid": e["pid"], "ancestry": ancestry(e["pid"])} for e in ends]}


def ancestry(pid: int) -> list[str]:
    """The command lines from process ``pid`` up to init."""
    out = []
    while pid > 1:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            pid = int(next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if x.startswith("PPid:")).split()[1])
        except OSError:
            break
    return out


@pytest.mark.timeout(420)  # also the cluster's start: master, worker, this driver, an executor
def test_sink_and_archive_reader_on_a_standalone_cluster(cluster, nsqd, topic, tmp_path):
    from nsqcli.records import envelope

    class M:  # the fields envelope() reads
        def __init__(self, i):
            self.topic, self.channel, self.nsqd = "arch", "c", "10.0.0.9:4150"
            self.id, self.body, self.timestamp, self.attempts = b"%016x" % i, b"a%d" % i, 1_795_000_000_000_000_000, 1

    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "arch.node-1.2026-11-22_09.log").write_text(
        "".join(json.dumps(envelope(M(i))) + "\n" for i in range(1500)))
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="check")
    result = on_a_driver(cluster, sink_job, nsqd.tcp_address, topic, str(archive))
    # executors ran in their own processes and imported nsqcli from the shipped zip
    assert result["shipped"] and result["shipped"].endswith(".zip")
    for path, on_an_executor, on_the_driver in result["where"]:
        assert on_an_executor and not on_the_driver
        assert ".zip" in path or "userFiles" in path, path
    assert topic_stats(nsqd, topic)["message_count"] == 20000
    assert channel_stats(nsqd, topic, "check")["depth"] == 20000
    assert result["archive"] == [{"topic": "arch", "host": "node-1", "nsqd": "10.0.0.9:4150", "count": 1500}]


def test_replay_and_query_commands_on_the_cluster(cluster, nsqd, topic, tmp_path):
    """`nsqcli replay` and `nsqcli query --master spark://...`: nsqcli ships itself (the runs are
    in this process, as tests/support/spark_runs.py does; tests/spark/test_spark_commands.py runs
    both as the real executable too)."""
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "src.node-2.2026-11-22_10.log").write_bytes(b"".join(b"line %d\n" % i for i in range(700)))
    r = nsqcli(["replay", str(archive), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--master", cluster,
                "--where", "body_text not like '%9'"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert topic_stats(nsqd, topic)["message_count"] == 630
    assert r.stderr.strip().splitlines()[-1].startswith(f"nsqcli: replayed 630 messages into {topic}")
    r = nsqcli(["query", "select host, count(*) as n from messages group by host", "-a", str(archive),
                "--master", cluster, "--json"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"host": "node-2", "n": 700}]


def test_the_source_reads_on_the_executors_of_a_standalone_cluster(cluster, nsqd, topic, tmp_path):
    """The driver plans; the executors' Python workers take the messages (each task's END marker
    names its process, whose ancestors are an executor JVM, not the driver)."""
    from nsqcli.client.producer import Producer

    with Producer(nsqd.tcp_address) as p:
        assert p.multi_publish(topic, [b"s%05d" % i for i in range(8000)]).published == 8000
    result = on_a_driver(cluster, source_job, nsqd.http_address, topic, str(tmp_path / "out"))
    assert result["error"] is None and result["rows"] == 8000
    took = [t for t in result["tasks"] if t["rows"]]
    assert sum(t["rows"] for t in took) == 8000 and len(took) >= 4  # 2000 per task
    for t in took:
        assert any("CoarseGrainedExecutorBackend" in line for line in t["ancestry"]), t["ancestry"]
        assert not any("SparkSubmit" in line for line in t["ancestry"])  # not the driver's JVM
    ch = channel_stats(nsqd, topic, "nsqcli_spark")
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0


if __name__ == "__main__":  # on_a_driver's process of its own: MASTER JOB ARGS...
    from pyspark import SparkContext

    _master, _job, *_args = sys.argv[1:]
    os.environ.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    assert SparkContext._gateway is None
    print("RESULT " + json.dumps(on_a_driver(_master, globals()[_job], *_args)), flush=True)
