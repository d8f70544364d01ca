"""The nsq source on a standalone Spark cluster (master + 1..N workers from the pip package, on
127.0.0.1) against `nsqcli to-file --gzip`, same nsqd, same run:

    .venv/bin/python -m bench.spark_cluster --messages 1000000 --workers 1 2

For each cluster size: N pre-published 100-byte messages read into Parquet with
trigger(availableNow=True) (default source options), timed until nsqd shows the channel drained;
a 20k-message run first starts the executors' Python workers (excluded). Reported: msg/s, the
ratio to to-file --gzip, and the driver's CPU per million messages (its JVM, which only plans and
schedules, and the Python process that runs the source's driver side).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.run import prepublish
from bench.spark import runner_cpu, wait_drained
from nsqcli.sandbox import NsqdOptions, Sandbox, free_port

ROOT = Path(__file__).resolve().parent.parent
NSQCLI = str(ROOT / ".venv/bin/nsqcli")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def driver_jvm_pid() -> int | None:
    for c in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (c / "children").read_text().split():
            if b"SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes():  # not the master/workers
                return int(pid)
    return None


class Cluster:
    def __init__(self, workers: int, cores: int, base: Path):
        import pyspark

        spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOG_DIR": str(base), "SPARK_WORKER_DIR": str(base / "work")}
        port, ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self.procs = [subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        for _ in range(workers):
            self.procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
                 "--memory", "3g", "--webui-port", str(free_port()), "--work-dir", str(base / "work"), self.url],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.loads(r.read()).get("aliveworkers", 0) == workers:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit("the standalone cluster did not come up")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def run_source(spark, sb, topic: str, n: int, out: str) -> tuple[float, float, float]:
    """(msg/s, driver JVM CPU-s, source runner CPU-s) for n pre-published messages."""
    prepublish(sb.nsqd.tcp_address, topic, n, 100)
    jvm = driver_jvm_pid()
    jvm0, run0 = cpu_seconds(jvm), runner_cpu()
    q = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", sb.nsqd.http_address).option("topic", topic)
         .option("channel", "c").option("spoolLocation", f"{out}/ck/spool").load()
         .writeStream.format("parquet").option("path", f"{out}/parquet").option("checkpointLocation", f"{out}/ck")
         .trigger(availableNow=True).start())
    el = wait_drained(sb, topic, "c", n, timeout=600)
    jvm_cpu, run_cpu = cpu_seconds(jvm) - jvm0, runner_cpu() - run0
    q.awaitTermination()
    return n / el, jvm_cpu, run_cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cores", type=int, default=1, help="cores per worker")
    a = ap.parse_args()
    n = a.messages
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    with Sandbox(NsqdOptions(mem_queue_size=n + 100_000), with_lookupd=False) as sb, \
            tempfile.TemporaryDirectory() as tmp:
        prepublish(sb.nsqd.tcp_address, "tofile", n, 100)
        p = subprocess.Popen([NSQCLI, "to-file", "-t", "tofile", "-c", "c", "--nsqd-tcp-address", sb.nsqd.tcp_address,
                              "--output-dir", f"{tmp}/tofile", "--gzip", "--no-live", "--max-in-flight", "2500"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tofile = n / wait_drained(sb, "tofile", "c", n, p, slack=2500)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        print(f"nsqcli to-file --gzip --max-in-flight 2500: {tofile:,.0f} msg/s", flush=True)
        from pyspark.sql import SparkSession

        from nsqcli.spark import register
        for w in a.workers:
            cluster = Cluster(w, a.cores, Path(tmp) / f"cluster{w}")
            try:
                spark = (SparkSession.builder.master(cluster.url).appName("nsqcli-bench")
                         .config("spark.pyspark.python", sys.executable).config("spark.driver.host", "127.0.0.1")
                         .config("spark.executor.memory", "2g").config("spark.executor.cores", str(a.cores))
                         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                         .getOrCreate())
                spark.sparkContext.setLogLevel("ERROR")
                register(spark)
                run_source(spark, sb, f"warm{w}", 20_000, f"{tmp}/warm{w}")
                rate, jvm_cpu, run_cpu = run_source(spark, sb, f"src{w}", n, f"{tmp}/src{w}")
                print(f"{w} worker(s) x {a.cores} core: source -> Parquet {rate:,.0f} msg/s = "
                      f"{rate / tofile:.2f}x to-file --gzip; driver CPU per million messages: JVM "
                      f"{jvm_cpu / n * 1e6:.2f} s, source runner (Python) {run_cpu / n * 1e6:.3f} s", flush=True)
                spark.stop()
            finally:
                cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
