"""nsqcli.spark against the CLI on the same nsqd, same run (`make bench-spark`):

- sink: ``df.write.format("nsq")`` of N 100-byte records (a cached DataFrame read from the same
  file) vs ``nsqcli mpub`` of that file;
- source: ``readStream.format("nsq")`` -> Parquet with trigger(availableNow=True), FIN after
  commit, vs ``nsqcli to-file`` (gzip) of N pre-published messages; both timed until nsqd shows
  the channel drained (every message FINed).

    .venv/bin/python -m bench.spark --messages 1000000

The SparkSession's start is timed apart and excluded. Peak RSS (VmHWM) is sampled for the driver
JVM, this Python driver, and the Python processes Spark starts (workers, stream runner).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from bench.run import prepublish
from bench.to_file import channel
from nsqcli.sandbox import NsqdOptions, Sandbox

ROOT = Path(__file__).resolve().parent.parent
NSQCLI = str(ROOT / ".venv/bin/nsqcli")


class RssSampler(threading.Thread):
    """Peak VmHWM per process among this process's descendants, by kind."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak: dict[str, float] = {}
        self.stop = threading.Event()

    @staticmethod
    def _children(pid: int) -> list[int]:
        out = []
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:  # the process is gone
            return out
        for task in tasks:
            try:
                out += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return out

    def _kind(self, pid: int) -> str:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return "?"
        if cmd and cmd[0].endswith(b"java"):
            return "driver JVM"
        if cmd and cmd[0].rsplit(b"/", 1)[-1] in (b"nsqd", b"nsqlookupd"):
            return "nsqd (the server)"
        if any(c.endswith(b"nsqcli") for c in cmd):
            return "nsqcli CLI"
        return "Spark Python (worker/runner)"

    def sample(self) -> None:
        todo, seen = [os.getpid()], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo += self._children(pid)
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            hwm = next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)
            kind = "bench driver (Python)" if pid == os.getpid() else self._kind(pid)
            self.peak[kind] = max(self.peak.get(kind, 0), hwm)

    def run(self) -> None:
        while not self.stop.wait(0.2):
            self.sample()


def runner_cpu() -> float:
    """CPU seconds (user + system) used so far by this process's descendants that run Spark's
    driver-side stream source (python_streaming_source_runner): the source's driver work."""
    total, todo = 0.0, [os.getpid()]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        pid = todo.pop()
        todo += RssSampler._children(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"python_streaming_source_runner" in cmd:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def sink_log(out: Path) -> list[tuple[int, int, list[str]]]:
    """The file sink's commit log: (batch, commit time in ns, the Parquet files that batch added)
    in batch order. Every 10th batch's log is a compaction (``N.compact``) that lists all files so
    far: its own files are those no earlier log named."""
    meta = Path(out) / "_spark_metadata"
    logs = sorted((p for p in meta.iterdir() if p.name.split(".")[0].isdigit()),
                  key=lambda p: int(p.name.split(".")[0])) if meta.is_dir() else []
    seen: set = set()
    got = []
    for log in logs:
        new = []
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            path = urllib.parse.unquote(urllib.parse.urlsplit(entry["path"]).path)
            if entry.get("action", "add") == "add" and path not in seen:
                seen.add(path)
                new.append(path)
        got.append((int(log.name.split(".")[0]), log.stat().st_mtime_ns, new))
    return got


def committed_files(out: Path) -> list[str]:
    """Every Parquet file the file sink committed (what Spark's readers see)."""
    return [f for _, _, files in sink_log(out) for f in files]


def wait_drained(sb, topic: str, ch: str, n: int, proc=None, timeout: float = 900, slack: int = 0) -> float:
    """Seconds until nsqd shows at least ``n - slack`` messages FINed on the channel (to-file's last
    partial batch waits for --sync-interval: not a measure of throughput, as in bench.to_file)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        c = channel(sb, topic, ch)
        if c and c["depth"] == 0 and c["message_count"] >= n and c["message_count"] - c["in_flight_count"] >= n - slack:
            return time.perf_counter() - t0
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{proc.args[1]} exited early")
        time.sleep(0.05)  # /stats costs nsqd CPU: polling faster slows what is measured
    raise SystemExit(f"{topic}/{ch} not drained after {timeout}s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--batch", type=int, default=None, help="source: maxMessagesPerBatch (default: the source's)")
    ap.add_argument("--per-partition", type=int, default=None,
                    help="source: maxMessagesPerPartition (default: the source's)")
    ap.add_argument("--only", choices=["sink", "source"])
    ap.add_argument("--opt", action="append", default=[], help="extra source option k=v (repeatable)")
    ap.add_argument("--runs", type=int, default=3, help="Spark runs of each (the first one is cold)")
    a = ap.parse_args()
    n = a.messages
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    sampler = RssSampler()
    sampler.start()
    with Sandbox(NsqdOptions(mem_queue_size=n + 10), with_lookupd=False) as sb, \
            tempfile.TemporaryDirectory() as tmp:
        addr = sb.nsqd.tcp_address
        records = Path(tmp) / "records.txt"
        with open(records, "wb") as f:
            for i in range(n):
                f.write(b"%010d" % i + b"x" * 90 + b"\n")
        from pyspark.sql import SparkSession

        t0 = time.perf_counter()
        spark = (SparkSession.builder.master(a.master).config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.driver.memory", "2g")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        from nsqcli.spark import register
        register(spark)
        print(f"{n:,} x 100 B on {a.master}; SparkSession start {time.perf_counter() - t0:.1f}s (excluded)",
              flush=True)

        if a.only in (None, "sink"):
            t = time.perf_counter()
            subprocess.run([NSQCLI, "mpub", "-t", "sink_mpub", "--nsqd-tcp-address", addr],
                           stdin=open(records, "rb"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=True)
            mpub = n / (time.perf_counter() - t)
            print(f"nsqcli mpub        {mpub:>10,.0f} msg/s", flush=True)
            df = spark.read.text(str(records)).selectExpr("value as body").repartition(2).cache()
            assert df.count() == n
            for run in range(a.runs):
                t = time.perf_counter()
                (df.write.format("nsq").option("nsqdTCPAddresses", addr).option("topic", f"sink_spark{run}")
                 .mode("append").save())
                sink = n / (time.perf_counter() - t)
                label = "first job: Python workers start" if run == 0 else "warm"
                print(f"spark nsq sink #{run + 1} {sink:>10,.0f} msg/s  ratio sink/mpub {sink / mpub:.2f}x  ({label})",
                      flush=True)
            df.unpersist()

        if a.only in (None, "source"):
            tofiles = {}
            for mif, sync in (("200", "30s"), ("2500", "30s")):
                topic = f"src_tofile{mif}"
                prepublish(addr, topic, n, 100)
                p = subprocess.Popen([NSQCLI, "to-file", "-t", topic, "-c", "c", "--nsqd-tcp-address", addr,
                                      "--output-dir", f"{tmp}/tofile{mif}", "--gzip", "--no-live",
                                      "--max-in-flight", mif, "--sync-interval", sync],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                tofile = tofiles[mif] = n / wait_drained(sb, topic, "c", n, p, slack=int(mif))
                p.send_signal(signal.SIGTERM)
                p.wait(60)
                print(f"nsqcli to-file     {tofile:>10,.0f} msg/s (gzip, --max-in-flight {mif} --sync-interval {sync})",
                      flush=True)
            for run in range(a.runs):
                topic = f"src_spark{run}"
                prepublish(addr, topic, n, 100)
                t = time.perf_counter()
                tuned = {k: str(v) for k, v in (("maxMessagesPerBatch", a.batch),
                                                 ("maxMessagesPerPartition", a.per_partition)) if v}
                cpu0 = runner_cpu()
                q = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", sb.nsqd.http_address)
                     .option("topic", topic).option("channel", "c").option("spoolLocation", f"{tmp}/ck{run}/spool")
                     .options(**tuned).options(**dict(kv.split("=", 1) for kv in a.opt)).load()
                     .writeStream.format("parquet").option("path", f"{tmp}/parquet{run}")
                     .option("checkpointLocation", f"{tmp}/ck{run}").trigger(availableNow=True).start())
                el = wait_drained(sb, topic, "c", n)
                driver_cpu = runner_cpu() - cpu0
                q.awaitTermination()
                total = time.perf_counter() - t
                phases: dict = {}
                for prog in q.recentProgress:
                    for k, v in (prog.durationMs or {}).items():
                        phases[k] = phases.get(k, 0) + v
                rows = spark.read.parquet(f"{tmp}/parquet{run}").count()
                source = n / el
                batches = len([p for p in Path(f"{tmp}/ck{run}/commits").iterdir() if p.name.isdigit()])
                print(f"spark nsq source #{run + 1} {source:>10,.0f} msg/s into Parquet ({rows:,} rows, {batches} "
                      f"batches, {tuned or 'default options'}; query ended after {total:.1f}s); ratio to to-file "
                      f"at --max-in-flight 200 (its default) {source / tofiles['200']:.2f}x, at 2500 "
                      f"{source / tofiles['2500']:.2f}x; the driver's source process used {driver_cpu:.2f} CPU-s "
                      f"({driver_cpu / n * 1e6:.2f} CPU-s per million messages)", flush=True)
                print("   Spark's time per phase over the run (s): " + ", ".join(
                    f"{k} {v / 1000:.1f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])), flush=True)
        sampler.sample()
        spark.stop()
    sampler.stop.set()
    print("peak RSS: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in sorted(sampler.peak.items())))


if __name__ == "__main__":
    sys.exit(main())
