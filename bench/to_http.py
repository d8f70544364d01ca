"""nsqcli to-http vs the official nsq_to_http: N pre-published messages POSTed to a fast real
HTTP endpoint - a second nsqd's /pub - with the same concurrency, same run.

    .venv/bin/python -m bench.to_http --messages 50000

Reports messages/s until the endpoint's topic holds all N (FIN after each 200 in both).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.run import prepublish
from bench.to_nsq import cpu_seconds, run_one
from nsqcli.sandbox import Sandbox, find_binary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--concurrency", type=int, default=100, help="nsq_to_http -n / nsqcli --concurrency")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with Sandbox(with_lookupd=False) as src, Sandbox(with_lookupd=False) as web:
        a = src.nsqd.tcp_address
        results: dict[str, list[float]] = {"nsqcli to-http": [], "nsq_to_http": []}
        for r in range(args.rounds):
            for name in results:
                topic = f"h{r}_{name.split()[-1].replace('-', '_')}"
                prepublish(a, topic, args.messages, 100)
                url = f"http://{web.nsqd.http_address}/pub?topic={topic}_out"
                if name == "nsq_to_http":
                    cmd = [find_binary("nsq_to_http"), "--topic", topic, "--nsqd-tcp-address", a, "--post", url,
                           "-n", str(args.concurrency)]
                else:
                    cmd = [sys.executable, "-m", "nsqcli", "to-http", "-t", topic, "--nsqd-tcp-address", a,
                           "--post", url, "--concurrency", str(args.concurrency), "-n", str(args.messages),
                           "--no-live"]
                web0, src0 = cpu_seconds(web.nsqd.pid), cpu_seconds(src.nsqd.pid)
                rate, rss, cpu = run_one(name, cmd, web.nsqd.http_address, topic + "_out", args.messages)
                web_cpu = cpu_seconds(web.nsqd.pid) - web0
                src_cpu = cpu_seconds(src.nsqd.pid) - src0
                results[name].append(rate)
                per = 1e6 / args.messages
                print(f"round {r + 1}: {name:15s} {rate:>10,.0f} msg/s   peak RSS {rss:6.1f} MB   CPU per delivery: "
                      f"{sum(cpu) * per:4.0f} us (user {cpu[0] * per:.0f}, system {cpu[1] * per:.0f}; endpoint {web_cpu * per:4.0f} us, source nsqd {src_cpu * per:4.0f} us)",
                      flush=True)
        med = {k: statistics.median(v) for k, v in results.items()}
        print(f"\nmedian of {args.rounds}: nsqcli to-http {med['nsqcli to-http']:,.0f} msg/s, nsq_to_http "
              f"{med['nsq_to_http']:,.0f} msg/s = {med['nsqcli to-http'] / med['nsq_to_http']:.2f}x "
              f"({args.messages:,} x 100 B POSTed to nsqd's /pub, concurrency {args.concurrency}, same run)")


if __name__ == "__main__":
    main()
