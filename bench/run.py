"""Benchmarks against the official Go programs and pynsq, on one local nsqd, in one run.

    make bench                      # 1,000,000 messages of 100 bytes
    BENCH_ARGS="--messages 200000" make bench

Prints messages/s for each contender and the ratios the issues ask for, and writes
bench/results/latest.json. Timing goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from nsqcli import Config, Producer
from nsqcli.client.http import http_json
from nsqcli.sandbox import NsqdOptions, Sandbox, find_binary

ROOT = Path(__file__).resolve().parent.parent
OPS = re.compile(rb"([\d.]+)ops/s")


def prepublish(address: str, topic: str, n: int, size: int) -> None:
    body = b"x" * size
    with Producer(address, Config()) as p:
        left = n
        while left:
            k = min(left, 100_000)
            p.multi_publish(topic, [body] * k, batch_size=500)
            left -= k


def go_bench(program: str, sb: Sandbox, topic: str, runfor: float, *extra: str) -> float:
    """Run Go bench_reader/bench_writer for ``runfor`` seconds; returns its ops/s."""
    out = subprocess.run([find_binary(program), f"--nsqd-tcp-address={sb.nsqd.tcp_address}",
                          f"--topic={topic}", "--size=100", f"--runfor={runfor}s", *extra],
                         capture_output=True, timeout=runfor + 60)
    m = OPS.search(out.stderr + out.stdout)
    if not m:
        raise RuntimeError(f"{program} said: {out.stderr[-300:]!r}")
    return float(m.group(1))


def go_reader(sb: Sandbox, topic: str, n: int) -> float:
    """bench_reader reports ops over a fixed --runfor (noisy for short windows); to compare like
    with like we time it as the Python consumers are timed: until it has received all n messages
    (nsqd's /stats: depth 0, message_count n). It batches FINs and never flushes the last
    partial batch, so "all FINed" cannot be waited for."""
    from nsqcli.client.http import http_json

    t0 = time.perf_counter()
    p = subprocess.Popen([find_binary("bench_reader"), f"--nsqd-tcp-address={sb.nsqd.tcp_address}",
                          f"--topic={topic}", "--channel=bench", "--size=100", "--runfor=600s"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            stats = http_json(sb.nsqd.http_address, "/stats", {"format": "json", "topic": topic,
                                                                "channel": "bench", "include_clients": "false"})
            ch = (stats.get("topics") or [{}])[0].get("channels") or []
            if ch and ch[0]["message_count"] >= n and ch[0]["depth"] == 0:
                return n / (time.perf_counter() - t0)
            if p.poll() is not None:
                raise RuntimeError(f"bench_reader exited early: {p.stderr.read()[:300]!r}")
            time.sleep(0.002)
    finally:
        p.kill()
        p.wait()


def py_reader(kind: str, sb: Sandbox, topic: str, n: int) -> float:
    out = subprocess.run([sys.executable, "-m", "bench.workers", kind, sb.nsqd.tcp_address, topic, str(n)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    try:
        got, secs = out.stdout.split()
    except ValueError:
        raise RuntimeError(f"{kind} consumer failed: {out.stderr[-500:]}") from None
    return int(got) / float(secs)


def go_writer(sb: Sandbox, topic: str, runfor: float) -> float:
    return go_bench("bench_writer", sb, topic, runfor, "--batch-size=200")


def py_writer(sb: Sandbox, topic: str, n: int) -> float:
    """The Producer, in this process (its CPU counted by getrusage(RUSAGE_SELF))."""
    from bench.workers import producer

    sent, secs = producer(sb.nsqd.tcp_address, topic, n)
    return sent / secs


def startup(cmd: list[str], stdin: bytes | None, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, input=stdin, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (nsqd), from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def message_count(sb: Sandbox, topic: str) -> int:
    """Messages a topic holds (no channel: everything published is still there)."""
    stats = http_json(sb.nsqd.http_address, "/stats", {"format": "json", "topic": topic})
    return sum(t["message_count"] for t in stats.get("topics") or [] if t["topic_name"] == topic)


def children_cpu(self_too: bool = False) -> float:
    """User + system CPU seconds of the waited-for children (nsqd, still running, is not in
    it); ``self_too``: and of this process (a writer run in-process or as a subprocess)."""
    import resource

    whos = (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF) if self_too else (resource.RUSAGE_CHILDREN,)
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, whos))


def timed(cmd: list[str], stdin_path: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process: start-up included, as a user sees it."""
    c0 = children_cpu()
    t0 = time.perf_counter()
    with open(stdin_path or "/dev/null", "rb") as f:
        subprocess.run(cmd, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0, children_cpu() - c0


def delete_topic(sb: Sandbox, topic: str) -> None:
    """Free a contender's topic; one that was never created (a contender that failed) is fine.
    Deleting a topic holding a million messages can take nsqd a while: a long timeout."""
    from nsqcli.errors import LookupdError

    try:
        http_json(sb.nsqd.http_address, "/topic/delete", {"topic": topic}, method="POST", timeout=120)
    except LookupdError as e:
        if e.status != 404:
            raise


def spread(xs: list[float]) -> str:
    return f"min {min(xs):,.0f} / median {statistics.median(xs):,.0f} / max {max(xs):,.0f}"


def ratio_line(ratios: list[float]) -> str:
    """Each round's ratio, then min / median / max."""
    return (f"{' '.join(f'{r:.2f}x' for r in ratios)}  "
            f"(min {min(ratios):.2f} / median {statistics.median(ratios):.2f} / max {max(ratios):.2f})")


def paired(results: dict, label: str, key: str, ours: list[float], peer: list[float]) -> None:
    """Ratios of runs made side by side (round i of ours / round i of the peer): this machine's
    speed drifts up to 2x between minutes, which a ratio of medians taken minutes apart
    mixes into the figure."""
    ratios = [a / b for a, b in zip(ours, peer)]
    results.setdefault("paired", {})[key] = ratios
    print(f"  {label:38s} per round {ratio_line(ratios)}", flush=True)


def report(results: dict, key: str, label: str, n: int, runs: list[tuple[float, float]]) -> None:
    """Median msg/s (and the spread) and CPU-s per million messages of ``runs`` (wall, cpu)."""
    rates = [n / wall for wall, _ in runs]
    results[key] = statistics.median(rates)
    results[key + "_runs"] = rates
    results[key + "_cpu_s_per_m"] = statistics.median(cpu / n * 1e6 for _, cpu in runs)
    print(f"{label:40s} {results[key]:>10,.0f} msg/s  {results[key + '_cpu_s_per_m']:5.2f} CPU-s/M  "
          f"({spread(rates)})", flush=True)


def cli_bench(sb: Sandbox, n: int, results: dict, pynsq: bool = True, repeat: int = 3) -> None:
    """The commands themselves, each a whole process (start-up included): mpub vs pynsq's Writer
    (alternated, ``repeat`` runs each) and to_nsq (one run: it is slow), tail vs nsq_tail
    (alternated) on the same records. nsqd is warmed with n messages first (its heap grows
    once), and every contender publishes to a fresh topic."""
    import tempfile

    addr = sb.nsqd.tcp_address
    nsqcli = str(ROOT / ".venv/bin/nsqcli")
    prepublish(addr, "cli_warm", n, 100)
    delete_topic(sb, "cli_warm")
    runs: dict[str, list] = {"cli_mpub": [], "pynsq_writer_mpub": [], "cli_tail": [], "go_nsq_tail": []}
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        line = b"x" * 100 + b"\n"
        f.write(line * n)
        f.flush()
        for i in range(repeat):
            runs["cli_mpub"].append(timed([nsqcli, "mpub", "-t", f"cli_mpub_{i}", "--nsqd-tcp-address", addr, f.name]))
            delete_topic(sb, f"cli_mpub_{i}")
            if pynsq:
                c0, t0 = children_cpu(), time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "bench.workers", "pynsq-writer", addr, f"cli_pynsq_{i}",
                                      f.name], capture_output=True, text=True, timeout=900, cwd=ROOT)
                wall = time.perf_counter() - t0
                try:
                    got, _ = out.stdout.split()
                    assert int(got) == n, got
                except (ValueError, AssertionError):
                    print(f"pynsq Writer failed: {out.stderr[-300:]}", flush=True)
                    pynsq = False
                else:
                    runs["pynsq_writer_mpub"].append((wall, children_cpu() - c0))
                delete_topic(sb, f"cli_pynsq_{i}")
        report(results, "cli_mpub", "nsqcli mpub (file, whole process)", n, runs["cli_mpub"])
        if runs["pynsq_writer_mpub"]:
            report(results, "pynsq_writer_mpub", "pynsq Writer MPUB (file, whole process)", n, runs["pynsq_writer_mpub"])
        report(results, "go_to_nsq", "Go to_nsq (file, one run)", n,
               [timed([find_binary("to_nsq"), "--topic=cli_to_nsq", f"--nsqd-tcp-address={addr}"], f.name)])
        delete_topic(sb, "cli_to_nsq")
        for i in range(repeat):
            for key, topic, cmd in (
                    ("cli_tail", f"tail_nsqcli_{i}", [nsqcli, "tail", "-n", str(n), "--nsqd-tcp-address", addr, "-t"]),
                    ("go_nsq_tail", f"tail_go_{i}", [find_binary("nsq_tail"), f"--nsqd-tcp-address={addr}",
                                                      "-n", str(n), "--topic"])):
                prepublish(addr, topic, n, 100)
                runs[key].append(timed(cmd + [topic]))
                delete_topic(sb, topic)
    report(results, "cli_tail", f"nsqcli tail -n {n} > /dev/null", n, runs["cli_tail"])
    report(results, "go_nsq_tail", f"Go nsq_tail -n {n} > /dev/null", n, runs["go_nsq_tail"])
    results["python_pass_s"] = startup([sys.executable, "-c", "pass"], None, 10)
    print(f"python -c pass:              {results['python_pass_s'] * 1000:>9.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=20, help="runs for the pub start-up timing")
    ap.add_argument("--skip-pynsq", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="consumer runs per contender (median reported)")
    ap.add_argument("--only", choices=["core", "cli", "all"], default="all")
    args = ap.parse_args()
    n = args.messages
    results: dict = {"messages": n, "size": 100}
    # room for what a timed writer (bench_writer runs for a time, not a count) publishes beyond
    # n: a message past the memory queue goes to disk, and would time the disk queue instead
    opts = NsqdOptions(mem_queue_size=4 * n + 10, max_rdy_count=2500)
    with Sandbox(opts, with_lookupd=False) as sb:
        addr = sb.nsqd.tcp_address
        print(f"nsqd {addr}; {n:,} messages of 100 bytes per contender", flush=True)

        if args.only in ("cli", "all"):
            cli_bench(sb, n, results, pynsq=not args.skip_pynsq, repeat=args.repeat)
        if args.only == "cli":
            results["nsqcli_pub_s"] = startup([str(ROOT / ".venv/bin/nsqcli"), "pub", "-t", "startup",
                                               "--nsqd-tcp-address", addr, "hi"], None, args.runs)
            print(f"nsqcli pub one message:      {results['nsqcli_pub_s'] * 1000:>9.1f} ms")
            print("ratios: mpub_vs_to_nsq {:.2f}x, mpub_vs_pynsq_writer {:.2f}x, tail_vs_nsq_tail {:.2f}x".format(
                results["cli_mpub"] / results["go_to_nsq"],
                results["cli_mpub"] / results.get("pynsq_writer_mpub", float("nan")),
                results["cli_tail"] / results["go_nsq_tail"]))
            return
        # -- consumers: alternate the contenders, --repeat times each, report medians --------
        runs: dict[str, list] = {"nsqcli_consumer": [], "nsqcli_consumer_each": [], "go_bench_reader": [],
                                 "raw_reader": []}
        for i in range(args.repeat):
            for key, fn in (("nsqcli_consumer", lambda t: py_reader("nsqcli", sb, t, n)),
                            ("nsqcli_consumer_each", lambda t: py_reader("nsqcli-each", sb, t, n)),
                            ("go_bench_reader", lambda t: go_reader(sb, t, n)),
                            ("raw_reader", lambda t: py_reader("raw", sb, t, n))):
                t = f"sub_{key}_{i}"
                prepublish(addr, t, n, 100)
                c0 = children_cpu()
                rate = fn(t)
                runs[key].append((n / rate, children_cpu() - c0))
                delete_topic(sb, t)
        for key, label in (("nsqcli_consumer", "nsqcli Consumer, FIN (batch handler)"),
                           ("nsqcli_consumer_each", "nsqcli Consumer, FIN (per message)"),
                           ("go_bench_reader", "Go bench_reader (receive all)"),
                           ("raw_reader", "reference: raw CPython reader")):
            report(results, key, label, n, runs[key])
        go_rates = results["go_bench_reader_runs"]
        paired(results, "Consumer (batch) / bench_reader", "consumer_vs_bench_reader",
               results["nsqcli_consumer_runs"], go_rates)
        paired(results, "Consumer (per message) / bench_reader", "per_message_consumer_vs_bench_reader",
               results["nsqcli_consumer_each_runs"], go_rates)
        if not args.skip_pynsq:
            prepublish(addr, "sub_pynsq", n, 100)
            results["pynsq_reader"] = py_reader("pynsq", sb, "sub_pynsq", n)
            print(f"pynsq Reader:                {results['pynsq_reader']:>12,.0f} msg/s", flush=True)

        # -- producers: alternated; nsqd's own CPU per message alongside each ---------------
        # bench_writer publishes on GOMAXPROCS connections (2 here), each waiting for its OK;
        # the Producer pipelines on one. The raw writer (no work per message, 256 batches in
        # flight) shows what one connection can take: nsqd reads, parses and stores a
        # connection's commands in one goroutine.
        wr: dict[str, list[float]] = {"nsqcli_mpub": [], "go_bench_writer": [], "raw_writer": []}
        nsqd_cpu: dict[str, list[float]] = {k: [] for k in wr}
        writer_cpu: dict[str, list[float]] = {k: [] for k in wr}  # the raw writer's: Python start-up too
        for i in range(args.repeat):
            for key in wr:
                t, c0, w0 = f"pub_{key}_{i}", process_cpu(sb.nsqd.pid), children_cpu(self_too=True)
                if key == "nsqcli_mpub":
                    rate, sent = py_writer(sb, t, n), n
                elif key == "raw_writer":
                    rate, sent = py_reader("raw-writer", sb, t, n), n
                else:
                    runfor = max(1.0, min(10.0, n / wr["nsqcli_mpub"][-1]))
                    rate = go_writer(sb, t, runfor)
                    sent = message_count(sb, t)
                wr[key].append(rate)
                nsqd_cpu[key].append((process_cpu(sb.nsqd.pid) - c0) / sent * 1e6)
                writer_cpu[key].append((children_cpu(self_too=True) - w0) / sent * 1e6)
                delete_topic(sb, t)
        for key, label in (("nsqcli_mpub", "nsqcli Producer MPUB (200)"), ("go_bench_writer", "Go bench_writer (200)"),
                           ("raw_writer", "reference: raw CPython writer (200)")):
            results[key], results[key + "_runs"] = statistics.median(wr[key]), wr[key]
            results[key + "_nsqd_cpu_s_per_m"] = nsqd = statistics.median(nsqd_cpu[key])
            results[key + "_cpu_s_per_m"] = own = statistics.median(writer_cpu[key])
            # on 2 cores the writer and nsqd share the machine: CPU per message x rate = cores busy
            cores = statistics.median(r * (a + b) / 1e6 for r, a, b in zip(wr[key], nsqd_cpu[key], writer_cpu[key]))
            print(f"{label:40s} {results[key]:>10,.0f} msg/s  writer {own:4.2f} + nsqd {nsqd:4.2f} CPU-s/M "
                  f"= {cores:3.1f} cores busy  ({spread(wr[key])})", flush=True)
        paired(results, "Producer / bench_writer", "mpub_vs_bench_writer", wr["nsqcli_mpub"], wr["go_bench_writer"])
        paired(results, "raw writer / bench_writer", "raw_python_writer_vs_bench_writer", wr["raw_writer"],
               wr["go_bench_writer"])

        # -- start-up -------------------------------------------------------------------
        results["nsqcli_pub_s"] = startup([str(ROOT / ".venv/bin/nsqcli"), "pub", "-t", "startup",
                                           "--nsqd-tcp-address", addr, "hi"], None, args.runs)
        results["to_nsq_s"] = startup([find_binary("to_nsq"), "--topic=startup", f"--nsqd-tcp-address={addr}"],
                                      b"hi\n", args.runs)
        print(f"nsqcli pub one message:      {results['nsqcli_pub_s'] * 1000:>9.1f} ms (median of {args.runs})")
        print(f"Go to_nsq one message:       {results['to_nsq_s'] * 1000:>9.1f} ms")

    r = results
    ratios = {}
    if "cli_mpub" in r:
        ratios.update(mpub_vs_to_nsq=r["cli_mpub"] / r["go_to_nsq"], tail_vs_nsq_tail=r["cli_tail"] / r["go_nsq_tail"])
        if "pynsq_writer_mpub" in r:
            ratios["mpub_vs_pynsq_writer"] = r["cli_mpub"] / r["pynsq_writer_mpub"]
    ratios |= {"consumer_vs_bench_reader": r["nsqcli_consumer"] / r["go_bench_reader"],
               "per_message_consumer_vs_bench_reader": r["nsqcli_consumer_each"] / r["go_bench_reader"],
               "raw_python_reader_vs_bench_reader": r["raw_reader"] / r["go_bench_reader"],
              "mpub_vs_bench_writer": r["nsqcli_mpub"] / r["go_bench_writer"],
              "raw_python_writer_vs_bench_writer": r["raw_writer"] / r["go_bench_writer"],
              "pub_startup_vs_to_nsq": r["nsqcli_pub_s"] / r["to_nsq_s"]}
    if "pynsq_reader" in r:
        ratios["consumer_vs_pynsq"] = r["nsqcli_consumer"] / r["pynsq_reader"]
        ratios["per_message_consumer_vs_pynsq"] = r["nsqcli_consumer_each"] / r["pynsq_reader"]
    results["ratios"] = ratios
    print("ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
