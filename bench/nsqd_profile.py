"""Where nsqd's CPU goes while each writer and reader runs: is nsqd the ceiling?

    .venv/bin/python -m bench.nsqd_profile --rounds 3        # needs `go` on PATH (go tool pprof)

One nsqd (v1.3.0, real), contenders alternated in each round. While a contender runs, nsqd's
own CPU profile is taken for ``--window`` seconds from its /debug/pprof/profile, and split by
the goroutines that do a connection's work:

- ``IOLoop``: one per connection; reads, parses and executes its commands (MPUB: read every
  message, make it, put it in the topic; FIN; RDY) and writes the OK.
- ``messagePump``: one per consumer connection; sends it messages.

A goroutine runs on one core at a time, so one connection's IOLoop near 1.0 core means that
connection cannot take more, whatever the client does. The "1 conn" writers show the ceiling of
one connection on this machine; bench_writer uses GOMAXPROCS connections (2 here). References:
the raw writer sends one MPUB built once, again and again (no work per message); the framing
writer does the Producer's per-message work (measure, cut, frame) in the raw writer's one-thread
loop, so the gap between the two is what framing costs, and the gap between it and the Producer
what the Producer's threads, futures and ledger cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.run import OPS, ROOT, children_cpu, delete_topic, prepublish
from nsqcli.sandbox import NsqdOptions, Sandbox, find_binary

#: a line of `go tool pprof -top -cum`: flat flat% sum% cum cum% name
TOP_LINE = re.compile(r"^\s*[\d.]+\w*\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(ms|s|us|µs|ns|min|h)\s+[\d.]+%\s+(.+)$")
TOTAL = re.compile(r"Duration: ([\d.]+)(ms|s|min).*Total samples = ([\d.]+)(ms|s|us|min)", re.S)
UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
GOROUTINES = {"IOLoop": "nsqd.(*protocolV2).IOLoop", "messagePump": "nsqd.(*protocolV2).messagePump",
              "topic pump": "nsqd.(*Topic).messagePump"}


def cores(profile: Path, go: str) -> dict[str, float]:
    """nsqd's cores busy over the profile's duration: in all, and per goroutine kind."""
    out = subprocess.run([go, "tool", "pprof", "-top", "-cum", "-nodecount=1000", str(profile)],
                         capture_output=True, text=True, timeout=120)
    m = TOTAL.search(out.stdout)
    if not m:
        raise SystemExit(f"go tool pprof said: {(out.stderr or out.stdout)[-300:]}")
    duration = float(m.group(1)) * UNIT[m.group(2)]
    got = {"nsqd": float(m.group(3)) * UNIT[m.group(4)] / duration}
    for line in out.stdout.splitlines():
        t = TOP_LINE.match(line)
        if t:
            for kind, name in GOROUTINES.items():
                if t.group(3).endswith(name):
                    got[kind] = float(t.group(1)) * UNIT[t.group(2)] / duration
    return got


def profiled(sb: Sandbox, cmds: list[list[str]], window: float, lead: float, go: str) -> tuple[list[str], dict, bool]:
    """Run ``cmds`` at once; after ``lead`` s take nsqd's CPU profile for ``window`` s. Returns
    their outputs, nsqd's cores (and, as "client", the cores the contender's processes kept busy
    over their whole run), and whether every one was still running when the window ended."""
    c0, t0 = children_cpu(), time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT) for c in cmds]
    outs: list[bytes] = [b""] * len(procs)

    def drain(i: int) -> None:
        outs[i] = procs[i].communicate()[0]

    readers = [threading.Thread(target=drain, args=(i,)) for i in range(len(procs))]
    for t in readers:
        t.start()
    try:
        time.sleep(lead)
        url = f"http://{sb.nsqd.http_address}/debug/pprof/profile?seconds={window:g}"
        with urllib.request.urlopen(url, timeout=window + 60) as resp, \
                tempfile.NamedTemporaryFile(suffix=".pb.gz", delete=False) as f:
            f.write(resp.read())
        busy = all(p.poll() is None for p in procs)
        for t in readers:
            t.join(600)
        client = (children_cpu() - c0) / (time.perf_counter() - t0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    try:
        return [o.decode(errors="replace") for o in outs], {**cores(Path(f.name), go), "client": client}, busy
    finally:
        Path(f.name).unlink()


def worker(kind: str, sb: Sandbox, topic: str, n: int) -> list[str]:
    return [sys.executable, "-m", "bench.workers", kind, sb.nsqd.tcp_address, topic, str(n)]


def go_bench(program: str, sb: Sandbox, topic: str, runfor: float, procs: int = 0, *extra: str) -> list[str]:
    env = ["env", f"GOMAXPROCS={procs}"] if procs else []
    return [*env, find_binary(program), f"--nsqd-tcp-address={sb.nsqd.tcp_address}", f"--topic={topic}",
            "--size=100", f"--runfor={runfor:g}s", *extra]


def rate_of(kind: str, outs: list[str]) -> float:
    """msg/s: a Python worker prints '<count> <seconds>'; the Go programs 'NNN ops/s'."""
    total = 0.0
    for out in outs:
        if kind.startswith("go"):
            m = OPS.search(out.encode())
            if not m:
                raise SystemExit(f"{kind} said: {out[-300:]!r}")
            total += float(m.group(1))
        else:
            try:
                got, secs = out.split()[-2:]
                total += int(got) / float(secs)
            except ValueError:
                raise SystemExit(f"{kind} failed: {out[-300:]!r}") from None
    return total


WRITERS = {  # label: (kind, connections)
    "nsqcli Producer (1 conn)": ("producer", 1),
    "raw CPython writer (1 conn)": ("raw-writer", 1),
    "framing CPython writer (1 conn)": ("framing-writer", 1),
    "Go bench_writer GOMAXPROCS=1 (1 conn)": ("go1", 1),
    "Go bench_writer (2 conns)": ("go", 2),
    "2 raw CPython writers (2 conns)": ("raw-writer", 2),
}
READERS = {
    "nsqcli Consumer, per message (1 conn)": ("nsqcli-each", 1),
    "raw CPython reader (1 conn)": ("raw", 1),
    "Go bench_reader (2 conns)": ("go", 2),
}
#: ours, and what each is compared with in the same round
OURS = {"nsqcli Producer (1 conn)": ("Go bench_writer (2 conns)", "raw CPython writer (1 conn)",
                                     "framing CPython writer (1 conn)"),
        "nsqcli Consumer, per message (1 conn)": ("Go bench_reader (2 conns)", "raw CPython reader (1 conn)")}
#: --pin: one core for nsqd, the other for the contender; only one-connection Python contenders
#: (a Go program's two connections on one core would not be bench_writer as users run it)
PINNED = ("nsqcli Producer (1 conn)", "raw CPython writer (1 conn)", "framing CPython writer (1 conn)",
          "nsqcli Consumer, per message (1 conn)", "raw CPython reader (1 conn)")


def pin_all_threads(pid: int, cpu: int) -> None:
    """Every thread of ``pid`` on ``cpu`` (threads made later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {cpu})


def command(label: str, sb: Sandbox, topic: str, args, runfor: float) -> list[list[str]]:
    kind, conns = (WRITERS.get(label) or READERS[label])
    if label in WRITERS:
        if kind.startswith("go"):
            return [go_bench("bench_writer", sb, topic, runfor, 1 if kind == "go1" else 0, "--batch-size=200")]
        return [worker(kind, sb, topic, args.messages) for _ in range(conns)]
    if kind == "go":
        return [go_bench("bench_reader", sb, topic, runfor, 0, "--channel=bench")]
    return [worker(kind, sb, topic, args.read)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000, help="per writer (enough to outlast the window)")
    ap.add_argument("--read", type=int, default=3_000_000, help="messages each reader drains")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=2.0, help="seconds of nsqd profile per contender")
    ap.add_argument("--lead", type=float, default=0.6, help="seconds after the start before the window")
    ap.add_argument("--pin", action="store_true",
                    help="nsqd on CPU 0, each contender on CPU 1: does the client's CPU take nsqd's?")
    args = ap.parse_args()
    go = shutil.which("go")
    if go is None:
        raise SystemExit("bench.nsqd_profile: 'go' is not on PATH (it reads nsqd's profile with go tool pprof)")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("bench.nsqd_profile: --pin needs 2 CPUs")
    runfor = args.lead + args.window + 0.5
    opts = NsqdOptions(mem_queue_size=2 * args.messages + 10, max_rdy_count=2500)
    labels = PINNED if args.pin else (*WRITERS, *READERS)
    rows: dict[str, list[dict]] = {k: [] for k in labels}
    with Sandbox(opts, with_lookupd=False) as sb:
        if args.pin:
            pin_all_threads(sb.nsqd.pid, 0)
        print(f"nsqd {sb.nsqd.tcp_address}; 100-byte messages; {args.window:g} s of nsqd profile per contender"
              f"{'; nsqd pinned to CPU 0, contenders to CPU 1' if args.pin else ''}", flush=True)
        for r in range(args.rounds):
            for label in labels:
                topic = f"b{r}_{re.sub('[^a-zA-Z0-9]+', '_', label)[:50]}"
                if label in READERS:
                    prepublish(sb.nsqd.tcp_address, topic, args.read, 100)
                cmds = command(label, sb, topic, args, runfor)
                if args.pin:
                    cmds = [["taskset", "-c", "1", *c] for c in cmds]
                outs, c, busy = profiled(sb, cmds, args.window, args.lead, go)
                rows[label].append({"rate": rate_of((WRITERS.get(label) or READERS[label])[0], outs), "busy": busy,
                                    **c})
                delete_topic(sb, topic)
            print(f"round {r + 1} done", flush=True)

    def med(xs: list[dict], k: str) -> float:
        return statistics.median(x.get(k, 0.0) for x in xs)

    print(f"\nmedian of {args.rounds} rounds: cores busy in nsqd during the window (IOLoop per connection:"
          f" / conns); client: the contender's own cores over its run")
    print(f"{'contender':40s} {'msg/s':>11s} {'nsqd':>6s} {'IOLoop':>7s} {'per conn':>8s} {'msgPump':>8s} "
          f"{'client':>7s}")
    for label, xs in rows.items():
        conns = (WRITERS.get(label) or READERS[label])[1]
        short = "" if all(x["busy"] for x in xs) else "  (ended inside the window: raise --messages/--read)"
        print(f"{label:40s} {med(xs, 'rate'):>11,.0f} {med(xs, 'nsqd'):6.2f} {med(xs, 'IOLoop'):7.2f} "
              f"{med(xs, 'IOLoop') / conns:8.2f} {med(xs, 'messagePump'):8.2f} {med(xs, 'client'):7.2f}{short}",
              flush=True)
    print("\nper round, ours against the others in the same round (min / median / max):")
    ratios = {}
    for ours, peers in OURS.items():
        for peer in peers:
            if ours in rows and peer in rows:
                qs = [x["rate"] / p["rate"] for x, p in zip(rows[ours], rows[peer])]
                ratios[f"{ours} / {peer}"] = qs
                print(f"  {ours} / {peer}\n      {' '.join(f'{q:.2f}x' for q in qs)}  "
                      f"({min(qs):.2f} / {statistics.median(qs):.2f} / {max(qs):.2f})")
    for label in ("raw CPython writer (1 conn)", "framing CPython writer (1 conn)", "2 raw CPython writers (2 conns)"):
        if label in rows and "Go bench_writer (2 conns)" in rows:
            qs = [x["rate"] / p["rate"] for x, p in zip(rows[label], rows["Go bench_writer (2 conns)"])]
            ratios[f"{label} / Go bench_writer (2 conns)"] = qs
            print(f"  ceiling: {label} / Go bench_writer (2 conns)\n      {' '.join(f'{q:.2f}x' for q in qs)}  "
                  f"({min(qs):.2f} / {statistics.median(qs):.2f} / {max(qs):.2f})")
    out = ROOT / "bench" / "results" / f"nsqd_profile{'_pinned' if args.pin else ''}.json"
    out.write_text(json.dumps({"window_s": args.window, "pinned": args.pin, "rounds": rows, "ratios": ratios},
                              indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
