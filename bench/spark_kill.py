"""kill -9 of the whole Spark driver (JVM, Python workers, stream runner) while the nsq source
streams into Parquet, numbered messages published throughout; then check exactly-once.

    .venv/bin/python -m bench.spark_kill --cycles 20
    .venv-spark-4.0.5/bin/python -m bench.spark_kill --cycles 10     # the oldest LTS (scripts/spark-env)

Odd cycles kill at a random moment; even cycles kill right after the file sink committed a
batch (a new ``_spark_metadata`` entry before Spark's own ``commits/N``: the window that gave
one duplicate batch per crash with the old driver-side source). At the end an AvailableNow run
takes the rest. Checked: every number nsqd acknowledged is in the committed Parquet output
exactly once, and the channel is empty. Exits 1 on any loss or duplicate.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.spark import committed_files
from nsqcli.sandbox import NsqdOptions, Sandbox

DRIVER = r'''
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession
http, topic, out, ck, mode = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2,3]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
from nsqcli.spark import register
register(spark)
w = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", http).option("topic", topic)
     .option("maxMessagesPerBatch", "2000" if mode == "run" else "200000").option("maxMessagesPerPartition", "700")
     .option("msgTimeout", "5s").option("spoolLocation", ck + "/spool")
     .load().writeStream.format("parquet").option("path", out).option("checkpointLocation", ck))
q = (w.trigger(availableNow=True) if mode == "drain" else w.trigger(processingTime="500 milliseconds")).start()
q.awaitTermination()
'''


def sink_entries(out: Path) -> int:
    meta = out / "_spark_metadata"
    return len([p for p in meta.iterdir() if p.name.split(".")[0].isdigit()]) if meta.exists() else 0


class Publisher(threading.Thread):
    def __init__(self, addr: str, topic: str, rate: int):
        super().__init__(daemon=True)
        self.addr, self.topic, self.rate = addr, topic, rate
        self.acked: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from nsqcli.client.producer import Producer

        n = 0
        with Producer(self.addr) as p:
            while not self.stop.is_set():
                batch = list(range(n, n + self.rate // 10))
                p.multi_publish(self.topic, [b"n%09d" % i for i in batch])
                self.acked += batch  # after nsqd's OK only
                n += len(batch)
                time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--rate", type=int, default=1000, help="messages/s published throughout")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with Sandbox(NsqdOptions(), with_lookupd=False) as sb, tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        script = tmpd / "driver.py"
        script.write_text(DRIVER)
        out, ck, topic = tmpd / "out", tmpd / "ck", "killed"
        args = [sys.executable, str(script), sb.nsqd.http_address, topic, str(out), str(ck)]
        from nsqcli.client.http import http_json
        http_json(sb.nsqd.http_address, "/topic/create", {"topic": topic}, method="POST")
        http_json(sb.nsqd.http_address, "/channel/create", {"topic": topic, "channel": "nsqcli_spark"}, method="POST")
        pub = Publisher(sb.nsqd.tcp_address, topic, a.rate)
        pub.start()
        t0 = time.monotonic()
        for cycle in range(1, a.cycles + 1):
            proc = subprocess.Popen(args + ["run"], env=env, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            before = sink_entries(out)
            if cycle % 2:
                deadline = time.monotonic() + 40
                while sink_entries(out) <= before and time.monotonic() < deadline:  # let it run first
                    time.sleep(0.05)
                time.sleep(rng.uniform(0, 3))
                how = "at a random moment"
            else:
                deadline = time.monotonic() + 60
                while sink_entries(out) <= before + rng.randint(0, 2) and time.monotonic() < deadline:
                    time.sleep(0.005)
                how = "right after a sink commit"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            print(f"cycle {cycle:>2}: kill -9 {how}; sink batches {sink_entries(out)}; "
                  f"published {len(pub.acked):,}", flush=True)
        pub.stop.set()
        pub.join()
        time.sleep(6)  # msg_timeout 5s: what the killed tasks held unpublished comes back
        # drains until one adds nothing: Spark < 4.2 runs availableNow as one batch per start
        # (the interrupted batch first), 4.2+ drains in one start and the next adds nothing
        for drains in range(1, 6):
            before = sink_entries(out)
            r = subprocess.run(args + ["drain"], env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                print(r.stderr[-3000:])
                return 1
            if drains > 1 and sink_entries(out) == before:
                break
        import pyarrow.dataset as ds

        got = ds.dataset(committed_files(out), format="parquet").to_table(columns=["body"]).column("body").to_pylist()
        nums = [int(b[1:]) for b in got]
        seen, dups = set(), 0
        for x in nums:
            dups += x in seen
            seen.add(x)
        missing = set(pub.acked) - seen
        st = http_json(sb.nsqd.http_address, "/stats", {"format": "json", "topic": topic})
        ch = st["topics"][0]["channels"][0]
        import pyspark
        print(f"pyspark {pyspark.__version__}: {a.cycles} kill -9 cycles in {time.monotonic() - t0:.0f}s: {len(pub.acked):,} acknowledged, "
              f"{len(nums):,} rows committed, {len(missing)} missing, {dups} duplicates; channel depth "
              f"{ch['depth']}, in flight {ch['in_flight_count']}")
        return 1 if missing or dups or ch["depth"] or ch["in_flight_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
