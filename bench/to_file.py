"""nsqcli to-file vs the official nsq_to_file: N pre-published 100-byte messages drained to gzip
files, same nsqd, same --max-in-flight and --sync-interval, fsync before FIN in both.

    .venv/bin/python -m bench.to_file --messages 500000 --max-in-flight 2500 --rounds 3

Reports messages/s (until nsqd shows the channel drained), peak RSS while archiving (VmHWM of the
running image: for nsqcli, the one it handed off to - nsqcli.cli.handoff; the first image, which
parses the command line for ~0.2 s, is measured by bench.rss_floor) and syncs/s. nsqcli
runs from a regular install in a scratch venv (bench.startup.regular_install), as users run it;
--nsqcli PATH runs another executable (e.g. .venv/bin/nsqcli, the editable one).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import prepublish
from nsqcli.client.http import http_json
from nsqcli.sandbox import NsqdOptions, Sandbox, find_binary

from .startup import regular_install



def channel(sb, topic, ch):
    stats = http_json(sb.nsqd.http_address, "/stats", {"format": "json", "topic": topic, "channel": ch})
    for t in stats.get("topics") or []:
        for c in t.get("channels") or []:
            return c
    return None


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_one(name, cmd, sb, topic, ch, n, out: Path, mif: int):
    """Time until everything but the last partial batch is FINed: that batch waits for
    --sync-interval in both tools alike, and is not a measure of throughput."""
    log = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    while True:
        c = channel(sb, topic, ch)
        if c and c["depth"] == 0 and c["message_count"] - c["in_flight_count"] >= n - mif:
            break
        if p.poll() is not None:
            log.seek(0)
            raise SystemExit(f"{name} exited early: {log.read()[-500:]!r}")
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    rss = peak_rss_mb(p.pid)
    fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    p.send_signal(signal.SIGTERM)
    p.wait(60)
    log.seek(0)
    err = log.read()
    records = sum(len(gzip.decompress(f.read_bytes()).splitlines()) for f in out.rglob("*.gz"))
    m = re.search(rb"in (\d+) syncs", err)
    syncs = int(m.group(1)) if m else None
    print(f"{name:14s} {n / elapsed:>10,.0f} msg/s  {elapsed:6.2f}s  {cpu / n * 1e6:4.2f} CPU-s/M  peak RSS {rss:6.1f} MB  "
          + (f"{syncs / elapsed:,.0f} syncs/s" if syncs else "syncs/s n/a")
          + f"  records on disk {records:,}", flush=True)
    return n / elapsed, rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--max-in-flight", type=int, default=2500)
    ap.add_argument("--sync-interval", default="30s")
    ap.add_argument("--rounds", type=int, default=3, help="alternated runs of each")
    ap.add_argument("--nsqcli", help="the executable to run (default: a regular install in a scratch venv, "
                                     "as pip installs it for users: bytecode compiled, no editable finder)")
    a = ap.parse_args()
    n = a.messages
    with Sandbox(NsqdOptions(mem_queue_size=n + 10), with_lookupd=False) as sb, \
            tempfile.TemporaryDirectory() as tmp:
        addr = sb.nsqd.tcp_address
        # an editable install with no bytecode written (PYTHONDONTWRITEBYTECODE) compiles every
        # module at each start: +3.4 MB of peak RSS that no pip-installed user has
        exe = a.nsqcli or str(regular_install(Path(tmp) / "venv"))
        print(f"{n:,} x 100 B, --max-in-flight {a.max_in_flight}, --sync-interval {a.sync_interval}, gzip")
        common = [f"--max-in-flight={a.max_in_flight}", f"--sync-interval={a.sync_interval}", "--gzip"]
        ratios, rss_ratios = [], []
        for r in range(a.rounds):
            prepublish(addr, f"tf_go{r}", n, 100)
            go, go_rss = run_one("nsq_to_file", [find_binary("nsq_to_file"), f"--topic=tf_go{r}", "--channel=c",
                                         f"--nsqd-tcp-address={addr}", f"--output-dir={tmp}/go{r}", *common],
                         sb, f"tf_go{r}", "c", n, Path(tmp) / f"go{r}", a.max_in_flight)
            prepublish(addr, f"tf_ours{r}", n, 100)
            ours, our_rss = run_one("nsqcli to-file", [exe, "to-file", "-t", f"tf_ours{r}", "-c", "c",
                                              "--nsqd-tcp-address", addr, "--output-dir", f"{tmp}/ours{r}",
                                              "--no-live", *common],
                           sb, f"tf_ours{r}", "c", n, Path(tmp) / f"ours{r}", a.max_in_flight)
            ratios.append(ours / go)
            rss_ratios.append(our_rss / go_rss)
            for t in (f"tf_go{r}", f"tf_ours{r}"):
                http_json(sb.nsqd.http_address, "/topic/delete", {"topic": t}, method="POST", timeout=120)
        print("ratio nsqcli/nsq_to_file: " + ", ".join(f"{x:.2f}x" for x in ratios)
              + f" (median {statistics.median(ratios):.2f}x)")
        print("peak RSS nsqcli/nsq_to_file: " + ", ".join(f"{x:.2f}x" for x in rss_ratios)
              + f" (median {statistics.median(rss_ratios):.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
