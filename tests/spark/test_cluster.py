"""nsqcli.spark on a REAL standalone Spark cluster: a master and a worker started from the pip
package (spark-class ... Master / Worker) on 127.0.0.1, executors in their own JVMs, nsqcli shipped
to them with nsqcli.spark.ship(). The sink and the archive reader run there. Every process this
test starts is stopped by its pid."""

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

pytestmark = pytest.mark.spark


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


DRIVER = r'''
import json, os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession
master, nsqd, topic, archive = sys.argv[1:5]
spark = (SparkSession.builder.master(master).appName("nsqcli-cluster-test")
         .config("spark.pyspark.python", sys.executable).config("spark.driver.host", "127.0.0.1")
         .config("spark.executor.memory", "1g").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
import nsqcli.spark
shipped = nsqcli.spark.ship(spark)
nsqcli.spark.register(spark)
where = spark.sparkContext.parallelize(range(4), 4).map(
    lambda _: (__import__("os").getpid(), __import__("nsqcli").__file__)).collect()
df = spark.range(20000).selectExpr("concat('c-', cast(id as string)) as body").repartition(4)
df.write.format("nsq").option("nsqdTCPAddresses", nsqd).option("topic", topic).mode("append").save()
rows = nsqcli.spark.read_archive(spark, archive).groupBy("topic", "host", "nsqd").count().collect()
print("RESULT " + json.dumps({"shipped": shipped, "driver_pid": os.getpid(), "where": where,
                              "archive": [r.asDict() for r in rows]}), flush=True)
spark.stop()
'''


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
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    r = subprocess.run([sys.executable, str(script), cluster, nsqd.tcp_address, topic, str(archive)],
                       env=clean_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
    # executors ran in their own processes and imported nsqcli from the shipped zip
    assert result["shipped"] and result["shipped"].endswith(".zip")
    pids = {pid for pid, _ in result["where"]}
    assert result["driver_pid"] not in pids
    assert all(".zip" in path or "userFiles" in path for _, path in result["where"]), result["where"]
    assert topic_stats(nsqd, topic)["message_count"] == 20000
    assert channel_stats(nsqd, topic, "check")["depth"] == 20000
    assert result["archive"] == [{"topic": "arch", "host": "node-1", "nsqd": "10.0.0.9:4150", "count": 1500}]


def test_replay_and_query_commands_on_the_cluster(cluster, nsqd, topic, tmp_path):
    """`nsqcli replay` and `nsqcli query --master spark://...`: nsqcli ships itself."""
    from tests.support.helpers import NSQCLI

    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "src.node-2.2026-11-22_10.log").write_bytes(b"".join(b"line %d\n" % i for i in range(700)))
    env = clean_env({"SPARK_LOCAL_IP": "127.0.0.1"})
    r = subprocess.run(NSQCLI + ["replay", str(archive), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address,
                                 "--master", cluster, "--where", "body_text not like '%9'"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert topic_stats(nsqd, topic)["message_count"] == 630
    assert r.stderr.strip().splitlines()[-1].startswith(f"nsqcli: replayed 630 messages into {topic}")
    r = subprocess.run(NSQCLI + ["query", "select host, count(*) as n from messages group by host", "-a",
                                 str(archive), "--master", cluster, "--json"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"host": "node-2", "n": 700}]


SOURCE_DRIVER = r'''
import json, os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession
master, http, topic, out = sys.argv[1:5]
spark = (SparkSession.builder.master(master).appName("nsqcli-cluster-source")
         .config("spark.pyspark.python", sys.executable).config("spark.driver.host", "127.0.0.1")
         .config("spark.executor.memory", "1g").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
import nsqcli.spark
nsqcli.spark.ship(spark)
nsqcli.spark.register(spark)
spool = out + "/ck/spool"
q = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", http).option("topic", topic)
     .option("maxMessagesPerPartition", "2000").option("spoolLocation", spool).load()
     .writeStream.format("parquet").option("path", out + "/parquet").option("checkpointLocation", out + "/ck")
     .trigger(availableNow=True).start())
q.awaitTermination(180)

def ancestry(pid):  # the command lines from the task's process up to init
    out = []
    while pid > 1:
        try:
            out.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace"))
            pid = int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("PPid:")).split()[1])
        except OSError:
            break
    return out

ends = []
for root, _, files in os.walk(spool):
    for f in files:
        data = open(os.path.join(root, f), "rb").read()
        if data[:1] == b"{":
            ends.append(json.loads(data))
tasks = [{"rows": e["rows"], "pid": e["pid"], "ancestry": ancestry(e["pid"])} for e in ends]
rows = spark.read.parquet(out + "/parquet").count()
print("RESULT " + json.dumps({"error": str(q.exception()) if q.exception() else None, "rows": rows,
                              "driver_pid": os.getpid(), "tasks": tasks}), flush=True)
spark.stop()
'''


def test_the_source_reads_on_the_executors_of_a_standalone_cluster(cluster, nsqd, topic, tmp_path):
    """The driver plans; the executors' Python workers take the messages (each task's END marker
    names its process, whose ancestors are an executor JVM, not the driver)."""
    from nsqcli.client.producer import Producer

    with Producer(nsqd.tcp_address) as p:
        assert p.multi_publish(topic, [b"s%05d" % i for i in range(8000)]).published == 8000
    script = tmp_path / "source_driver.py"
    script.write_text(SOURCE_DRIVER)
    r = subprocess.run([sys.executable, str(script), cluster, nsqd.http_address, topic, str(tmp_path / "out")],
                       env=clean_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["error"] is None and result["rows"] == 8000
    took = [t for t in result["tasks"] if t["rows"]]
    assert sum(t["rows"] for t in took) == 8000 and len(took) >= 4  # 2000 per task
    for t in took:
        assert any("CoarseGrainedExecutorBackend" in line for line in t["ancestry"]), t["ancestry"]
        assert not any("SparkSubmit" in line for line in t["ancestry"])  # not the driver's JVM
    ch = channel_stats(nsqd, topic, "nsqcli_spark")
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0
