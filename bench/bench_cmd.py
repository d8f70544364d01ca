"""nsqcli bench vs the official bench_writer / bench_reader, same nsqd, same run.

    .venv/bin/python -m bench.bench_cmd --messages 1000000

Publish: `nsqcli bench pub` (1 publisher, MPUB batches of 200) vs bench_writer --batch-size=200
(--runfor long enough for the same count). Consume: `nsqcli bench sub` vs bench_reader, each
draining its own topic of N pre-published messages (timed until nsqd shows it drained).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench.run import go_reader, go_writer, prepublish
from nsqcli.sandbox import NsqdOptions, Sandbox


def nsqcli_bench(sb: Sandbox, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "nsqcli", "bench", *args, "--json", "--nsqd-tcp-address",
                          sb.nsqd.tcp_address], capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"nsqcli bench {' '.join(args)} failed: {out.stderr[-400:]}")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.messages
    # messages stay in memory (the default 10,000-message queue spills to disk: both tools then
    # measured nsqd's disk queue, ~170k msg/s)
    with Sandbox(NsqdOptions(mem_queue_size=2 * n + 10), with_lookupd=False) as sb:
        ours_pub = nsqcli_bench(sb, "pub", "-t", "ours_pub", "-n", str(n), "--size", "100", "--batch-size", "200")
        go_pub = go_writer(sb, "go_pub", max(2.0, n / 400_000))
        prepublish(sb.nsqd.tcp_address, "ours_sub", n, 100)
        prepublish(sb.nsqd.tcp_address, "go_sub", n, 100)
        ours_sub = nsqcli_bench(sb, "sub", "-t", "ours_sub", "-c", "bench", "-n", str(n), "--size", "100")
        go_sub = go_reader(sb, "go_sub", n)
        ps = nsqcli_bench(sb, "pubsub", "-t", "ours_pubsub", "-n", str(n // 5), "--size", "100")
    p, s = ours_pub["pub"]["msgs_per_sec"], ours_sub["sub"]["msgs_per_sec"]
    print(f"publish  {n:,} x 100 B: nsqcli bench pub {p:>10,.0f} msg/s   bench_writer {go_pub:>10,.0f} msg/s   "
          f"= {p / go_pub:.2f}x")
    print(f"consume  {n:,} x 100 B: nsqcli bench sub {s:>10,.0f} msg/s   bench_reader {go_sub:>10,.0f} msg/s   "
          f"= {s / go_sub:.2f}x")
    lat = ps["sub"]["latency_ms"]
    print(f"pubsub   {n // 5:,} x 100 B: pub {ps['pub']['msgs_per_sec']:,.0f} msg/s, sub {ps['sub']['msgs_per_sec']:,.0f} "
          f"msg/s, end-to-end p50 {lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms p99.9 {lat['p99.9']:.1f} ms")


if __name__ == "__main__":
    main()
