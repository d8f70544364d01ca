"""How fast `nsqcli to-parquet` stops on SIGTERM under load, what it leaves in flight, and that
nothing is lost or taken twice across the stops.

    .venv/bin/python -m bench.spark_stop --stops 3 --backlog 1000000 --rate 20000

A backlog of numbered 100-byte messages is published first, and more at ``--rate`` throughout.
Each cycle starts `nsqcli to-parquet` (local[2], its defaults, trigger 1s) on the same checkpoint,
waits for its first committed batch plus a random 0-5 s, sends SIGTERM and times the exit. After
each stop: the messages nsqd shows in flight (held by nobody now: they would wait out
msg_timeout). At the end an --available-now run takes the rest; every acknowledged number must
be in the committed output exactly once. Exits 1 on a loss, a duplicate or a failed stop.
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
from bench.to_file import channel
from nsqcli.sandbox import NsqdOptions, Sandbox

ROOT = Path(__file__).resolve().parent.parent
NSQCLI = str(ROOT / ".venv/bin/nsqcli")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stops", type=int, default=3)
    ap.add_argument("--backlog", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=20_000, help="messages/s published while it runs")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    from nsqcli.client.producer import Producer

    topic, ch = "stop", "nsqcli_to_parquet"
    acked = [0]  # numbers 0..acked-1 were acknowledged by nsqd
    with Sandbox(NsqdOptions(mem_queue_size=a.backlog + 2_000_000), with_lookupd=False) as sb, \
            tempfile.TemporaryDirectory() as tmp:
        out, ck = Path(tmp) / "out", Path(tmp) / "ck"
        from nsqcli.client.http import http_json
        for what, params in (("topic", {"topic": topic}), ("channel", {"topic": topic, "channel": ch})):
            http_json(sb.nsqd.http_address, f"/{what}/create", params, method="POST")  # the backlog lands in it
        with Producer(sb.nsqd.tcp_address) as p:
            for i in range(0, a.backlog, 5000):
                k = min(5000, a.backlog - i)
                assert p.multi_publish(topic, [b"%d" % j for j in range(i, i + k)]).published == k
        acked[0] = a.backlog
        stop_pub = threading.Event()

        def publish():
            with Producer(sb.nsqd.tcp_address) as p:
                step, nxt = 100 / a.rate, time.monotonic()
                while not stop_pub.is_set():
                    n = acked[0]
                    if p.multi_publish(topic, [b"%d" % j for j in range(n, n + 100)]).published == 100:
                        acked[0] = n + 100
                    nxt += step
                    time.sleep(max(0.0, nxt - time.monotonic()))

        pub = threading.Thread(target=publish, daemon=True)
        pub.start()
        cmd = [NSQCLI, "to-parquet", topic, "-o", str(out), "--checkpoint", str(ck), "--trigger", "1s",
               "--nsqd-tcp-address", sb.nsqd.tcp_address, "--nsqd-http-address", sb.nsqd.http_address,
               "--partition-by", ""]
        failed = False
        times = []
        for cycle in range(a.stops):
            before = len(committed_files(out))
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
            deadline = time.monotonic() + 180
            while len(committed_files(out)) == before and time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.1)
            time.sleep(rnd.uniform(0, 5))
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                rc = p.wait()
                failed = True
            took = time.monotonic() - t0
            times.append(took)
            c = channel(sb, topic, ch) or {}
            print(f"stop {cycle + 1}: exit {rc} after SIGTERM in {took:.1f}s; nsqd shows {c.get('in_flight_count')} "
                  f"in flight (held by nobody: back after msg_timeout), depth {c.get('depth')}", flush=True)
            if rc != 0:
                failed = True
                print(p.stderr.read()[-2000:], file=sys.stderr)
        stop_pub.set()
        pub.join()
        deadline = time.monotonic() + 120  # what the stopped runs held comes back after msg_timeout
        while time.monotonic() < deadline:
            c = channel(sb, topic, ch) or {}
            if c.get("in_flight_count") == 0 and c.get("deferred_count") == 0:
                break
            time.sleep(1)
        final = subprocess.run(cmd + ["--available-now"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, timeout=900)
        rc = final.returncode
        print("final run:", final.stderr[-1500:])
        import pyarrow.parquet as pq

        got = [int(b) for f in committed_files(out) for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]
        n = acked[0]
        missing = n - len(set(got) & set(range(n)))
        if missing:
            gone = sorted(set(range(n)) - set(got))
            runs, start = [], gone[0]
            for x, y in zip(gone, gone[1:] + [None]):
                if y != x + 1:
                    runs.append(f"{start}-{x}" if x > start else str(start))
                    if y is not None:
                        start = y
            c = channel(sb, topic, ch) or {}
            print(f"missing numbers: {', '.join(runs[:20])}{' ...' if len(runs) > 20 else ''}; the channel now: "
                  f"depth {c.get('depth')}, in flight {c.get('in_flight_count')}, deferred {c.get('deferred_count')}, "
                  f"messages {c.get('message_count')}; final run: {rc} {p.stderr.read()[-1500:] if False else ''}")
        dup = len(got) - len(set(got))
        print(f"{a.stops} SIGTERMs under load ({a.rate}/s on a {a.backlog:,} backlog): stop took max "
              f"{max(times):.1f}s, median {sorted(times)[len(times) // 2]:.1f}s; {n:,} acknowledged, "
              f"{len(got):,} rows committed: {missing} missing, {dup} duplicates (final run exit {rc})")
        return 1 if failed or missing or dup or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
