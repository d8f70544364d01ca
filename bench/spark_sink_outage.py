"""The nsq sink's counts when nsqd stops mid-write (issue 34, part 3), as a user measured it:
df.write.format("nsq") of N rows, nsqd stopped (SIGTERM, keeps what it acknowledged) once a
quarter of them landed, started again on the same port and data path OUTAGE seconds later.
For each case: the driver's line (from commitReportPath's report), the report's numbers, and
nsqd's /stats depth - the line must never say more than nsqd holds, nor "published 0" when
rows landed.

    .venv/bin/python bench/spark_sink_outage.py --rows 400000 --outage 6

Cases: local[2,4] with the default retryTimeout (60s: the tasks wait the restart out);
local[2,4] and local[2] with retryTimeout 2s (tasks fail: Spark retries them, or the job
aborts). One Spark session per master, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def depth(nsqd, topic):
    from helpers import topic_stats

    return (topic_stats(nsqd, topic) or {}).get("depth", 0)


def case(spark, nsqd, n, outage, retry_timeout, topic, base):
    report = Path(base) / f"{topic}.json"
    nsqd.stop()  # started again by this (the main) thread: the last case's thread took it along
    nsqd._start_retrying(15.0)
    df = spark.range(0, n, 1, 8).selectExpr("concat('row-', cast(id as string)) as body")
    events, written, up = {}, threading.Event(), threading.Event()

    def stop_start():  # nsqd dies with the thread that started it (PR_SET_PDEATHSIG): it waits
        while depth(nsqd, topic) < n // 4:
            time.sleep(0.02)
        events["stopped_at"] = depth(nsqd, topic)
        nsqd.stop()
        time.sleep(outage)
        nsqd._start_retrying(15.0)
        up.set()
        written.wait(600)

    t = threading.Thread(target=stop_start, daemon=True)
    t.start()
    t0 = time.monotonic()
    error = None
    try:
        opts = {"nsqdTCPAddresses": nsqd.tcp_address, "topic": topic, "commitReportPath": str(report)}
        if retry_timeout:
            opts["retryTimeout"] = retry_timeout
        df.write.format("nsq").options(**opts).mode("append").save()
    except Exception as e:
        error = str(e).splitlines()[0][:160]
    elapsed = time.monotonic() - t0
    up.wait(60)  # an aborted job may end before nsqd is back
    got = depth(nsqd, topic)
    written.set()
    t.join(30)
    doc = json.loads(report.read_text())
    return {"retryTimeout": retry_timeout or "60s (default)", "state": doc["state"], "elapsed_s": round(elapsed, 1),
            "stopped_at_depth": events.get("stopped_at"), "nsqd_depth": got, "published": doc["published"],
            "acknowledged": doc["acknowledged"], "exact": doc["exact"],
            "may_be_duplicates": doc["may_be_duplicates"], "line_true": line_true(doc, got), "line": doc["line"],
            "error": error}


def line_true(doc, got) -> bool:
    """nsqd's depth is within what the report says: acknowledged (or, unknown, at least the
    committed tasks'), plus at most the messages sent again after a lost connection; when the
    report is not exact, at least acknowledged."""
    low = doc["acknowledged"] if doc["acknowledged"] is not None else doc["published"]
    if doc["acknowledged"] is None or not doc["exact"]:
        return got >= low
    return low <= got <= low + doc["may_be_duplicates"]


def run_master(master, cases, n, outage):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from nsqcli.sandbox import NsqdOptions, Sandbox
    from nsqcli.spark import register

    spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("OFF")
    register(spark)
    out = []
    with tempfile.TemporaryDirectory() as base:
        sb = Sandbox(NsqdOptions(), with_lookupd=False, base_dir=os.path.join(base, "nsq")).start()
        try:
            for k, rt in enumerate(cases):
                r = case(spark, sb.nsqd, n, outage, rt, f"outage{k}", base)
                r["master"] = master
                out.append(r)
                print(json.dumps(r), flush=True)
        finally:
            sb.stop()
            spark.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--outage", type=float, default=6.0)
    ap.add_argument("--master", default=None, help="one master only (default: local[2,4] then local[2])")
    a = ap.parse_args()
    if a.master:
        cases = [None, "2s"] if "," in a.master else ["2s"]
        run_master(a.master, cases, a.rows, a.outage)
        return
    import subprocess
    for master in ("local[2,4]", "local[2]"):  # one JVM at a time
        subprocess.run([sys.executable, __file__, "--rows", str(a.rows), "--outage", str(a.outage),
                        "--master", master], check=False)


if __name__ == "__main__":
    main()
