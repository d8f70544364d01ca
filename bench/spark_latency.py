"""Latency of the nsq source: publish -> committed in the Parquet sink, at a steady rate.

    .venv/bin/python -m bench.spark_latency --rate 200 --trigger 1 --seconds 60

Each body carries its publish time (ns); a batch's commit time is the mtime of the file sink's
``_spark_metadata/N``. First a few messages make the first batch, which also starts the
executors' Python workers: its wait is reported apart as the cold start. Then, at the steady
rate, the oldest message's wait per batch (max, median) and every message's wait (p50, p99).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.spark import sink_log
from nsqcli.sandbox import NsqdOptions, Sandbox


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--trigger", type=float, default=1.0, help="processingTime trigger, seconds")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args()
    os.environ["PYSPARK_PYTHON"] = __import__("sys").executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from nsqcli.client.producer import Producer
    from nsqcli.spark import register

    spark = (SparkSession.builder.master(a.master).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    with Sandbox(NsqdOptions(), with_lookupd=False) as sb, tempfile.TemporaryDirectory() as tmp:
        out, ck = Path(tmp) / "out", Path(tmp) / "ck"
        q = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", sb.nsqd.http_address)
             .option("topic", "lat").option("spoolLocation", str(ck / "spool")).load()
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(processingTime=f"{int(a.trigger * 1000)} milliseconds").start())
        stop = threading.Event()

        def publish():
            with Producer(sb.nsqd.tcp_address) as p:
                step, nxt = 1.0 / a.rate, time.monotonic()
                while not stop.is_set():
                    p.publish("lat", b"%d" % time.time_ns())
                    nxt += step
                    time.sleep(max(0.0, nxt - time.monotonic()))

        t = threading.Thread(target=publish, daemon=True)

        def committed() -> list:
            """Each committed batch with rows, in order: its messages' waits, publish -> commit
            (the log's mtime). Batch 0 of a new query is always empty: Spark runs it at start."""
            import pyarrow.parquet as pq

            got = []
            for _, when, files in sink_log(out):
                waits = [(when - int(b)) / 1e9 for f in files
                         for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]
                if waits:
                    got.append(waits)
            return got

        time.sleep(5)  # the query is up and has run its empty batch 0
        with Producer(sb.nsqd.tcp_address) as p:
            for _ in range(20):
                p.publish("lat", b"%d" % time.time_ns())
        deadline = time.monotonic() + 120
        while not committed() and time.monotonic() < deadline:
            time.sleep(0.1)
        cold = committed()
        if not cold:
            raise SystemExit("the first batch was not committed within 120 s")
        t.start()
        time.sleep(a.seconds)
        stop.set()
        t.join()
        time.sleep(3 * a.trigger + 3)
        q.stop()
        oldest, every = [], []
        for w in committed()[len(cold):]:
            oldest.append(max(w))
            every += w
        every.sort()
        print(f"cold start: the first batch (it starts the executors' Python workers) waited "
              f"{max(max(w) for w in cold):.2f}s")
        print(f"{a.rate} msg/s for {a.seconds:.0f}s, trigger {a.trigger}s, {a.master}: {len(oldest)} batches "
              f"measured ({len(every):,} messages). Oldest message per batch, publish -> commit: max "
              f"{max(oldest):.2f}s, median {statistics.median(oldest):.2f}s. Every message: p50 "
              f"{every[len(every) // 2]:.2f}s, p99 {every[int(len(every) * 0.99)]:.2f}s")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
