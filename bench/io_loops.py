"""Who drives the connections: one I/O loop thread, a few, or (before issue 32) a thread per
connection - measured on the same nsqd in one run.

    python -m bench.io_loops [--conns 1,10,2000] [--messages 200000] [--old REV]

For each connection count C, C topics share ``--messages`` 100-byte messages (published
first); a contender is a child process that subscribes one Consumer per topic (batch
handler, FIN on return, max_in_flight 200; since issue 32 they share one pool of 2 handler
threads, as to-file's topics do) and runs until every message is FINed or ``--limit`` passed. Reported
per contender: msg/s over the whole run (connecting included), the child's CPU seconds per
million messages (user + system, all its threads), the time until every connection was up,
peak threads and fds. Contenders: ``loops=1`` and ``loops=2`` (NSQCLI_IO_THREADS) of this
checkout, and ``per-conn`` - the same child run against the package of ``--old`` (default:
8bd3491, the last commit with a thread per connection) checked out in a temporary worktree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = r"""
import json, os, resource, sys, threading, time
import nsqcli
from nsqcli import Config, Consumer

address, prefix, conns, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
LIMIT = float(sys.argv[5])
done = [0]
lock = threading.Lock()
finished = threading.Event()

def handler(msgs):
    with lock:
        done[0] += len(msgs)
        if done[0] >= total:
            finished.set()

def peak():
    with open("/proc/self/status") as f:
        threads = next(int(l.split()[1]) for l in f if l.startswith("Threads:"))
    return threads, len(os.listdir("/proc/self/fd"))

t0 = time.monotonic()
try:  # the handler threads every consumer shares (since issue 32; before, one per consumer)
    from nsqcli.client.workers import HandlerPool
    shared = {"handlers": HandlerPool(2)}
except ImportError:
    shared = {}
consumers = [Consumer(f"{prefix}{i}", "c", batch_handler=handler, nsqd_tcp_addresses=[address],
                      config=Config(max_in_flight=200), **shared) for i in range(conns)]
for c in consumers:
    c.start(fail_fast=False)  # as to-file starts its topics: connections come up side by side
threads, fds = peak()
ramp = None
while not finished.wait(0.05):
    t, f = peak()
    threads, fds = max(threads, t), max(fds, f)
    if ramp is None and all(c.connections for c in consumers):
        ramp = time.monotonic() - t0
    if time.monotonic() - t0 > LIMIT:
        break
wall = time.monotonic() - t0
ramp = wall if ramp is None else ramp
ru = resource.getrusage(resource.RUSAGE_SELF)
for c in consumers:
    c.stop(5)
print(json.dumps(dict(wall=wall, ramp=ramp, cpu=ru.ru_utime + ru.ru_stime, done=done[0], threads=threads,
                      fds=fds, package=os.path.dirname(nsqcli.__file__))))
"""


def start_nsqd(tmp: Path):
    from nsqcli.sandbox import find_binary
    from nsqcli.client.transport import split_address  # noqa: F401 (package importable)
    import socket

    def free():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    tcp, http = free(), free()
    p = subprocess.Popen([find_binary("nsqd"), f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
                          f"--data-path={tmp}", "--mem-queue-size=1000000", "--max-rdy-count=2500"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, f"127.0.0.1:{tcp}"


def publish(address: str, prefix: str, conns: int, total: int) -> None:
    from nsqcli import Producer

    per = max(1, total // conns)
    body = b"x" * 100
    with Producer(address) as p:
        for i in range(conns):
            left = per
            while left:
                n = min(left, 5000)
                p.multi_publish(f"{prefix}{i}", [body] * n)
                left -= n


def run_child(pythonpath: str | None, loops: int, address: str, prefix: str, conns: int, total: int,
              limit: float) -> dict:
    env = {**os.environ, "NSQCLI_IO_THREADS": str(loops)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    try:
        cmd = [sys.executable, "-P", "-c", CHILD, address, prefix, str(conns), str(total), str(limit)]
        if os.environ.get("BENCH_PY_SPY"):  # a profile of each child: py-spy's raw (collapsed) stacks
            cmd = ["py-spy", "record", "--format", "raw", "-r", "50", "-o",
                   f"{os.environ['BENCH_PY_SPY']}-{conns}-{loops}.txt", "--"] + cmd
        r = subprocess.run(cmd,
                           env=env, capture_output=True, timeout=limit + 60, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {limit + 60:.0f} s"}
    if r.returncode != 0:
        return {"error": r.stderr.decode()[-300:]}
    return json.loads([line for line in r.stdout.decode().splitlines() if line.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", default="1,10,2000")
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--old", default="8bd3491")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds a contender may take")
    ap.add_argument("--only", default="per-conn,loops=1,loops=2", help="contenders, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.old],
                       check=True, capture_output=True)
        nsqd, address = start_nsqd(Path(tmp))
        try:
            time.sleep(0.5)
            contenders = [(n, p, k) for n, p, k in [("per-conn", str(old), 1), ("loops=1", str(ROOT), 1),
                                                    ("loops=2", str(ROOT), 2)] if n in args.only.split(",")]
            for conns in map(int, args.conns.split(",")):
                total = max(1, args.messages // conns) * conns
                print(f"\n{conns} connection(s), {total:,} messages of 100 bytes")
                for k, (name, path, loops) in enumerate(contenders):
                    prefix = f"io{conns}_{k}_{int(time.time())}_"
                    publish(address, prefix, conns, total)
                    r = run_child(path, loops, address, prefix, conns, total, args.limit)
                    if "error" in r:
                        print(f"  {name:16s} failed: {r['error']}")
                        continue
                    short = "" if r["done"] >= total else f"  ONLY {r['done']:,} within {args.limit:.0f} s"
                    print(f"  {name:16s} {r['done'] / r['wall']:>10,.0f} msg/s  {r['cpu'] / r['done'] * 1e6:6.2f} CPU-s/M"
                          f"  connected in {r['ramp']:5.2f} s  threads {r['threads']:5d}  fds {r['fds']:5d}{short}")
        finally:
            nsqd.terminate()
            nsqd.wait(10)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], capture_output=True)


if __name__ == "__main__":
    main()
