"""Where nsqd's CPU goes while each writer and reader runs: is nsqd the ceiling?

    .venv/bin/python -m bench.nsqd_profile --rounds 5        # needs `go` on PATH (go tool pprof)
    .venv/bin/python -m bench.nsqd_profile --rounds 4 --pin  # nsqd on one CPU, the contender on another

One nsqd (v1.3.0, real), contenders alternated in each round. While a contender runs, nsqd's
own CPU profile is taken for ``--window`` seconds from its /debug/pprof/profile and split by
the goroutines that do a connection's work:

- ``IOLoop``: one per connection; reads, parses and executes its commands (MPUB: read every
  message, make it, put it in the topic; FIN; RDY) and writes the OK.
- ``messagePump``: one per consumer connection; sends it messages.

The rate is nsqd's, over the same window: messages the topic took (writers), or FINs the
channel's clients sent (readers), from /stats just before and after it. A goroutine runs on
one core at a time, so one connection's IOLoop near 1.0 core means that connection cannot
take more, whoever writes to it. bench_writer uses GOMAXPROCS connections (2 here).

References, not clients: the raw writer sends one MPUB built once, again and again (no work per
message), with 256 or 16 batches in flight; the framing writer runs the raw writer's one-thread
loop with 16 in flight (the Producer's window) doing the Producer's per-message work (measure
each list once, cut, frame). Framing writer vs raw writer at 16: what framing costs; Producer
vs framing writer: what its threads, futures and ledger cost.

--pin puts nsqd on the first CPU this process may use and each contender on the second (nsqd
keeps GOMAXPROCS=2 on its one CPU); the Go programs are left out then - two connections on one
core is not how they are run.
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

from bench.run import ROOT, children_cpu, delete_topic, message_count, prepublish, ratio_line
from nsqcli.client.http import http_json
from nsqcli.sandbox import NsqdOptions, Sandbox, find_binary

#: a line of `go tool pprof -top -cum`: flat flat% sum% cum cum% name (pprof's units: ns us ms s hrs)
TOP_LINE = re.compile(r"^\s*[\d.]+\w*\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(ns|us|µs|ms|s|hrs)\s+[\d.]+%\s+(.+)$")
DURATION = re.compile(r"Duration: ([\d.]+)(ns|us|ms|s|hrs)")
SAMPLES = re.compile(r"Total samples = ([\d.]+)(ns|us|µs|ms|s|hrs)?")
UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "hrs": 3600.0, None: 1.0}
GOROUTINES = {"IOLoop": "nsqd.(*protocolV2).IOLoop", "messagePump": "nsqd.(*protocolV2).messagePump"}
CHANNEL = "bench"  # the readers' channel (bench.workers, bench_reader --channel)

WRITERS = {  # label: (kind, connections, batches in flight or None for the writer's own)
    "nsqcli Producer (1 conn, 16 in flight)": ("producer", 1, None),
    "raw CPython writer (1 conn, 256 in flight)": ("raw-writer", 1, 256),
    "raw CPython writer (1 conn, 16 in flight)": ("raw-writer", 1, 16),
    "framing CPython writer (1 conn, 16 in flight)": ("framing-writer", 1, 16),
    "Go bench_writer GOMAXPROCS=1 (1 conn)": ("go1", 1, None),
    "Go bench_writer (2 conns)": ("go", 2, None),
    "2 raw CPython writers (2 conns, 256 each)": ("raw-writer", 2, 256),
}
READERS = {
    "nsqcli Consumer, per message (1 conn)": ("nsqcli-each", 1, None),
    "raw CPython reader (1 conn)": ("raw", 1, None),
    "Go bench_reader (2 conns)": ("go", 2, None),
}
GO_WRITER, GO_READER = "Go bench_writer (2 conns)", "Go bench_reader (2 conns)"
#: ours, and what each is compared with in the same round
OURS = {"nsqcli Producer (1 conn, 16 in flight)": (GO_WRITER, "framing CPython writer (1 conn, 16 in flight)",
                                                   "raw CPython writer (1 conn, 16 in flight)",
                                                   "raw CPython writer (1 conn, 256 in flight)"),
        "nsqcli Consumer, per message (1 conn)": (GO_READER, "raw CPython reader (1 conn)")}
#: references against the Go programs
REFERENCES = {"framing CPython writer (1 conn, 16 in flight)": GO_WRITER,
              "raw CPython writer (1 conn, 16 in flight)": GO_WRITER,
              "raw CPython writer (1 conn, 256 in flight)": GO_WRITER,
              "2 raw CPython writers (2 conns, 256 each)": GO_WRITER,
              "raw CPython reader (1 conn)": GO_READER}


def cores(profile: Path, go: str) -> dict[str, float]:
    """nsqd's cores busy over the profile's duration: in all, and per goroutine kind."""
    out = subprocess.run([go, "tool", "pprof", "-top", "-cum", "-nodecount=1000", str(profile)],
                         capture_output=True, text=True, timeout=120, check=False)
    d, n = DURATION.search(out.stdout), SAMPLES.search(out.stdout)
    if not d or not n:
        raise SystemExit(f"go tool pprof said: {(out.stderr or out.stdout)[-300:]}")
    duration = float(d.group(1)) * UNIT[d.group(2)]
    got = {"nsqd": float(n.group(1)) * UNIT[n.group(2)] / duration}  # "Total samples = 0": no unit
    for line in out.stdout.splitlines():
        t = TOP_LINE.match(line)
        if t:
            for kind, name in GOROUTINES.items():
                if t.group(3).endswith(name):
                    got[kind] = float(t.group(1)) * UNIT[t.group(2)] / duration
    return got


def counted(sb: Sandbox, topic: str, reader: bool) -> int:
    """Messages the topic has taken (a writer), or FINs its channel's clients sent (a reader)."""
    if not reader:
        return message_count(sb, topic)
    stats = http_json(sb.nsqd.http_address, "/stats", {"format": "json", "topic": topic, "channel": CHANNEL})
    return sum(c.get("finish_count", 0) for t in stats.get("topics") or [] if t["topic_name"] == topic
               for ch in t.get("channels") or [] if ch["channel_name"] == CHANNEL for c in ch.get("clients") or [])


def profiled(sb: Sandbox, cmds: list[list[str]], topic: str, reader: bool, args, go: str,
             cpu: int | None) -> dict:
    """Run ``cmds`` at once (on ``cpu`` if given); after ``args.lead`` s take nsqd's CPU profile
    for ``args.window`` s. Returns nsqd's rate and cores over that window, the cores the
    contenders' processes kept busy over their whole run ("client"), and whether every one was
    still running when the window ended ("busy")."""
    c0, t0 = children_cpu(), time.perf_counter()
    procs: list[subprocess.Popen] = []
    outs: list[bytes] = []
    readers: list[threading.Thread] = []
    fd, path = tempfile.mkstemp(suffix=".pb.gz")
    os.close(fd)
    try:
        for c in cmds:
            procs.append(subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT))
            outs.append(b"")
            if cpu is not None:  # before it makes threads: they inherit it
                os.sched_setaffinity(procs[-1].pid, {cpu})
        for i, p in enumerate(procs):
            readers.append(threading.Thread(target=lambda i=i, p=p: outs.__setitem__(i, p.communicate()[0])))
            readers[-1].start()
        time.sleep(args.lead)
        n0, w0 = counted(sb, topic, reader), time.perf_counter()
        url = f"http://{sb.nsqd.http_address}/debug/pprof/profile?seconds={args.window:g}"
        with urllib.request.urlopen(url, timeout=args.window + 60) as resp:
            Path(path).write_bytes(resp.read())
        n1, w1 = counted(sb, topic, reader), time.perf_counter()
        busy = all(p.poll() is None for p in procs)
        for t in readers:
            t.join(600)
        for p, out in zip(procs, outs, strict=True):
            if p.returncode:
                raise SystemExit(f"{' '.join(p.args[-5:])} failed: {out[-300:].decode(errors='replace')}")
        return {"rate": (n1 - n0) / (w1 - w0), "busy": busy, **cores(Path(path), go),
                "client": (children_cpu() - c0) / (time.perf_counter() - t0)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        Path(path).unlink(missing_ok=True)


def command(label: str, sb: Sandbox, topic: str, args, runfor: float) -> list[list[str]]:
    kind, conns, window = WRITERS.get(label) or READERS[label]
    go_args = [f"--nsqd-tcp-address={sb.nsqd.tcp_address}", f"--topic={topic}", "--size=100", f"--runfor={runfor:g}s"]
    if kind.startswith("go"):
        if label in WRITERS:
            env = ["env", "GOMAXPROCS=1"] if kind == "go1" else []
            return [[*env, find_binary("bench_writer"), *go_args, "--batch-size=200"]]
        return [[find_binary("bench_reader"), *go_args, f"--channel={CHANNEL}"]]
    n = args.messages if label in WRITERS else args.read
    extra = [str(window)] if window else []
    return [[sys.executable, "-m", "bench.workers", kind, sb.nsqd.tcp_address, topic, str(n), *extra]
            for _ in range(conns)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000, help="per writer (enough to outlast the window)")
    ap.add_argument("--read", type=int, default=3_000_000, help="messages each reader drains")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=2.0, help="seconds of nsqd profile per contender")
    ap.add_argument("--lead", type=float, default=0.6, help="seconds after the start before the window")
    ap.add_argument("--pin", action="store_true",
                    help="nsqd on one CPU, each contender on another: does the client's CPU take nsqd's?")
    args = ap.parse_args()
    go = shutil.which("go")
    if go is None:
        raise SystemExit("bench.nsqd_profile: 'go' is not on PATH (it reads nsqd's profile with go tool pprof)")
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        raise SystemExit("bench.nsqd_profile: --pin needs 2 CPUs")
    runfor = args.lead + args.window + 0.5
    opts = NsqdOptions(mem_queue_size=2 * args.messages + 10, max_rdy_count=2500)
    labels = [k for k in (*WRITERS, *READERS) if not (args.pin and k.startswith("Go "))]
    rows: dict[str, list[dict]] = {k: [] for k in labels}
    with Sandbox(opts, with_lookupd=False) as sb:
        if args.pin:
            for tid in os.listdir(f"/proc/{sb.nsqd.pid}/task"):  # threads made later inherit it
                os.sched_setaffinity(int(tid), {cpus[0]})
        print(f"nsqd {sb.nsqd.tcp_address}; 100-byte messages; {args.window:g} s of nsqd profile per contender"
              f"{f'; nsqd pinned to CPU {cpus[0]}, contenders to CPU {cpus[1]}' if args.pin else ''}", flush=True)
        for r in range(args.rounds):
            for label in labels:
                topic = f"b{r}_{re.sub('[^a-zA-Z0-9]+', '_', label)[:50]}"
                reader = label in READERS
                if reader:
                    prepublish(sb.nsqd.tcp_address, topic, args.read, 100)
                rows[label].append(profiled(sb, command(label, sb, topic, args, runfor), topic, reader, args, go,
                                            cpus[1] if args.pin else None))
                delete_topic(sb, topic)
            print(f"round {r + 1} done", flush=True)

    def med(xs: list[dict], k: str) -> float:
        return statistics.median(x.get(k, 0.0) for x in xs)

    print(f"\nmedian of {args.rounds} rounds, over each {args.window:g} s window: nsqd's msg/s and cores busy "
          f"(IOLoop per connection: / conns); client: the contender's own cores over its whole run")
    print(f"{'contender':48s} {'msg/s':>11s} {'nsqd':>6s} {'IOLoop':>7s} {'per conn':>8s} {'msgPump':>8s} "
          f"{'client':>7s}")
    for label, xs in rows.items():
        conns = (WRITERS.get(label) or READERS[label])[1]
        short = "" if all(x["busy"] for x in xs) else "  (ended inside the window: raise --messages/--read)"
        print(f"{label:48s} {med(xs, 'rate'):>11,.0f} {med(xs, 'nsqd'):6.2f} {med(xs, 'IOLoop'):7.2f} "
              f"{med(xs, 'IOLoop') / conns:8.2f} {med(xs, 'messagePump'):8.2f} {med(xs, 'client'):7.2f}{short}",
              flush=True)
    print("\nper round, against the others in the same round:")
    ratios = {}
    pairs = [(ours, peer) for ours, peers in OURS.items() for peer in peers]
    for ours, peer in pairs + list(REFERENCES.items()):
        if ours in rows and peer in rows:
            qs = [x["rate"] / p["rate"] for x, p in zip(rows[ours], rows[peer], strict=True)]
            ratios[f"{ours} / {peer}"] = qs
            print(f"  {ours} / {peer}\n      {ratio_line(qs)}")
    out = ROOT / "bench" / "results" / f"nsqd_profile{'_pinned' if args.pin else ''}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"window_s": args.window, "pinned": args.pin, "rounds": rows, "ratios": ratios},
                              indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
