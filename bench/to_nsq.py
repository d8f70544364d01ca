"""nsqcli to-nsq vs the official nsq_to_nsq: N pre-published messages copied from one nsqd to
another (two real nsqd on this machine), FIN after the destination's OK in both.

    .venv/bin/python -m bench.to_nsq --messages 200000 --size 100

Reports messages/s until the destination topic holds all N, and peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import prepublish
from bench.to_file import peak_rss_mb
from nsqcli.client.http import http_json
from nsqcli.sandbox import Sandbox, find_binary


def count(address: str, topic: str) -> int:
    stats = http_json(address, "/stats", {"format": "json", "topic": topic})
    return sum(t["message_count"] for t in stats.get("topics") or [] if t["topic_name"] == topic)


def run_one(name: str, cmd: list[str], dest_http: str, topic: str, n: int) -> tuple[float, float, float]:
    """(msg/s, peak RSS MB, (user, system) CPU seconds) of one contender, until the destination holds n."""
    log = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    while count(dest_http, topic) < n:
        if p.poll() is not None and count(dest_http, topic) < n:
            log.seek(0)
            raise SystemExit(f"{name} exited early: {log.read()[-500:]!r}")
        if time.perf_counter() - t0 > 600:
            raise SystemExit(f"{name}: not done in 600 s")
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    rss = peak_rss_mb(p.pid)
    cpu = cpu_seconds(p.pid, split=True)
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    p.wait(60)
    return n / elapsed, rss, cpu


def cpu_seconds(pid: int, split: bool = False):
    """user + system CPU seconds of a live process so far ((user, system) with ``split``)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    user, system = (int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK"))
    return (user, system) if split else user + system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nsqcli-args", default="", help="extra flags for nsqcli to-nsq, e.g. '--max-in-flight 2500'")
    args = ap.parse_args()
    with Sandbox(with_lookupd=False) as src, Sandbox(with_lookupd=False) as dst:
        a, b = src.nsqd.tcp_address, dst.nsqd.tcp_address
        results: dict[str, list[tuple[float, float]]] = {"nsqcli to-nsq": [], "nsq_to_nsq": []}
        for r in range(args.rounds):
            for name in results:
                topic = f"b{r}_{name.split()[-1].replace('-', '_')}"
                prepublish(a, topic, args.messages, args.size)
                if name == "nsq_to_nsq":
                    cmd = [find_binary("nsq_to_nsq"), "--topic", topic, "--nsqd-tcp-address", a,
                           "--destination-nsqd-tcp-address", b, "--destination-topic", topic + "_copy"]
                else:
                    cmd = [sys.executable, "-m", "nsqcli", "to-nsq", "-t", topic, "--nsqd-tcp-address", a,
                           "--destination-nsqd-tcp-address", b, "--destination-topic", topic + "_copy",
                           "-n", str(args.messages), "--no-live", *args.nsqcli_args.split()]
                rate, rss, _ = run_one(name, cmd, dst.nsqd.http_address, topic + "_copy", args.messages)
                results[name].append((rate, rss))
                print(f"round {r + 1}: {name:15s} {rate:>10,.0f} msg/s   peak RSS {rss:6.1f} MB", flush=True)
        best = {k: max(x[0] for x in v) for k, v in results.items()}
        print(f"\nbest of {args.rounds}: nsqcli to-nsq {best['nsqcli to-nsq']:,.0f} msg/s, nsq_to_nsq "
              f"{best['nsq_to_nsq']:,.0f} msg/s = {best['nsqcli to-nsq'] / best['nsq_to_nsq']:.2f}x "
              f"({args.messages:,} x {args.size} B, same nsqd pair, same run)")


if __name__ == "__main__":
    main()
