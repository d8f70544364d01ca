"""The nsq source on a standalone Spark cluster (master + 1..N workers from the pip package, on
127.0.0.1) against `nsqcli to-file --gzip`, same nsqd, same run:

    .venv/bin/python -m bench.spark_cluster --messages 1000000 --workers 1 2

For each cluster size: N pre-published 100-byte messages read into Parquet with
trigger(availableNow=True) (default source options), timed until nsqd shows the channel drained;
a first run of ``--warm`` messages starts the executors' Python workers and warms their JVM's JIT
(excluded: a streaming query runs for days). Reported: msg/s, the ratio to to-file --gzip, and
the CPU each process of this run used per million messages (nsqd, to-file; the driver's JVM,
which only plans and schedules, the Python process that runs the source's driver side, the
executors' JVMs and their Python workers): with every process on one machine, its cores divided
by the CPU per message is the most that machine can do.
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
from bench.spark import RssSampler, wait_drained
from nsqcli.sandbox import NsqdOptions, Sandbox, free_port

ROOT = Path(__file__).resolve().parent.parent
NSQCLI = str(ROOT / ".venv/bin/nsqcli")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


ROLES = ((b"CoarseGrainedExecutorBackend", "executor JVM"), (b"pyspark.daemon", "executor Python"),
         (b"pyspark/daemon", "executor Python"), (b"python_streaming_source_runner", "driver Python (source)"),
         (b"SparkSubmit", "driver JVM"), (b"deploy.master", "master"), (b"deploy.worker", "worker"),
         (b" to-file ", "to-file"))


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of this process and its descendants (nsqd, to-file, Spark), by role.
    Python workers forked by an executor's daemon count as the executor's Python."""
    out: dict[str, float] = {}
    todo = [(os.getpid(), "bench (this process, polling /stats)")]
    while todo:
        pid, parent = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            cpu = cpu_seconds(pid)
        except OSError:
            continue
        role = next((r for key, r in ROLES if key in cmd), None)
        if role is None:
            first = cmd.split(b" ", 1)[0]
            role = "nsqd" if first.endswith(b"/nsqd") else parent if parent.startswith("executor") else "other"
        if pid == os.getpid():
            role = parent
        out[role] = out.get(role, 0.0) + cpu
        todo += [(c, role) for c in RssSampler._children(pid)]
    return out


def cpu_line(before: dict, after: dict, n: int) -> str:
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    used = {k: v for k, v in used.items() if v >= 0.005 * n / 1e6}
    total = sum(used.values())
    parts = ", ".join(f"{k} {v / n * 1e6:.2f}" for k, v in sorted(used.items(), key=lambda kv: -kv[1]))
    return (f"CPU-s per million messages: {total / n * 1e6:.2f} ({parts}); at most {os.cpu_count() / total * n:,.0f}"
            f" msg/s on this machine's {os.cpu_count()} cores")


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


def run_source(spark, sb, topic: str, n: int, out: str) -> tuple[float, str]:
    """(msg/s, CPU line) for n pre-published messages."""
    prepublish(sb.nsqd.tcp_address, topic, n, 100)
    cpu0 = cpu_by_role()
    q = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", sb.nsqd.http_address).option("topic", topic)
         .option("channel", "c").option("spoolLocation", f"{out}/ck/spool").load()
         .writeStream.format("parquet").option("path", f"{out}/parquet").option("checkpointLocation", f"{out}/ck")
         .trigger(availableNow=True).start())
    el = wait_drained(sb, topic, "c", n, timeout=600)
    cpu = cpu_line(cpu0, cpu_by_role(), n)
    q.awaitTermination()
    return n / el, cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cores", type=int, default=1, help="cores per worker")
    ap.add_argument("--warm", type=int, default=200_000, help="messages of the first, unmeasured run")
    a = ap.parse_args()
    n = a.messages
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    with Sandbox(NsqdOptions(mem_queue_size=n + 100_000), with_lookupd=False) as sb, \
            tempfile.TemporaryDirectory() as tmp:
        prepublish(sb.nsqd.tcp_address, "tofile", n, 100)
        cpu0 = cpu_by_role()
        p = subprocess.Popen([NSQCLI, "to-file", "-t", "tofile", "-c", "c", "--nsqd-tcp-address", sb.nsqd.tcp_address,
                              "--output-dir", f"{tmp}/tofile", "--gzip", "--no-live", "--max-in-flight", "2500"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tofile = n / wait_drained(sb, "tofile", "c", n, p, slack=2500)
        cpu = cpu_line(cpu0, cpu_by_role(), n)
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        print(f"nsqcli to-file --gzip --max-in-flight 2500: {tofile:,.0f} msg/s; {cpu}", flush=True)
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
                run_source(spark, sb, f"warm{w}", a.warm, f"{tmp}/warm{w}")
                rate, cpu = run_source(spark, sb, f"src{w}", n, f"{tmp}/src{w}")
                print(f"{w} worker(s) x {a.cores} core: source -> Parquet {rate:,.0f} msg/s = "
                      f"{rate / tofile:.2f}x to-file --gzip; {cpu}", flush=True)
                spark.stop()
            finally:
                cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
