"""What --metrics-address and --status-file cost `nsqcli to-file` (issue 35; goal: within 5%).

    .venv/bin/python -m bench.daemon_metrics [--messages 1000000] [--rounds 3]   # ~2 min

(1,000,000 a run: a run of 200,000 lasts ~0.7 s, start-up weighs in and a 1/s scraper never
gets an answer.) nsqcli runs from a regular install in a scratch venv, as in bench.to_file.

Against one real nsqd, each round archives N pre-published 100-byte messages (gzip, the same
--max-in-flight and --sync-interval as bench.to_file) with:

  nsq_to_file  the Go peer, same options
  (a) plain    nsqcli to-file
  (b) metrics  (a) + --metrics-address 127.0.0.1:PORT --status-file F
  (c) scraped  (b) + a scraper GETting /metrics every 1 s (as Prometheus would)
  (d) stress   (b) + a scraper GETting /metrics 10 times a second

The nsqcli variants run in a different order each round (rotated), each on a fresh topic.
For each run: msg/s from exec until nsqd's /stats shows the channel drained (all but the last
partial batch FINed: it waits for --sync-interval, as in bench.to_file), msg/s in the steady
part (10% -> 90% FINed, start-up left out: a daemon runs for months), CPU seconds per million
messages (utime+stime of the process), and peak RSS (VmHWM from /proc/PID/status, read before
the SIGTERM; for nsqcli that is the image it handed off to, same pid). Then the ratios to (a),
per round (paired: same load on the box) and their median.

Then (a) and (b) side by side, subscribed to an empty topic for --idle-seconds: CPU while idle,
peak RSS connected and idle, and what one /metrics scrape costs (b) in CPU (--scrapes GETs back
to back). CPU is utime+stime from /proc/PID/stat (clock ticks, ended threads included).

Checks that make a wrong figure visible: every archive holds N records; the variants with
--metrics-address answer /metrics with nsqcli_messages_received_total reaching N (scraped
after the timing, before the SIGTERM), the scrapers' error count, and the status file (written at
the stop) says N finished.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.run import prepublish
from nsqcli.client.http import http_json
from nsqcli.sandbox import NsqdOptions, Sandbox, find_binary, free_port

from .startup import regular_install

VARIANTS = ("a", "b", "c", "d")
LABEL = {"go": "nsq_to_file", "a": "(a) plain", "b": "(b) metrics+status", "c": "(c) + scrape 1/s",
         "d": "(d) + scrape 10/s"}
SCRAPE_EVERY = {"c": 1.0, "d": 0.1}


def channel(sb, topic, ch):
    stats = http_json(sb.nsqd.http_address, "/stats", {"format": "json", "topic": topic, "channel": ch})
    for t in stats.get("topics") or []:
        for c in t.get("channels") or []:
            return c
    return None


def proc_status(pid: int) -> tuple[float, float]:
    """(peak RSS MB, CPU seconds) of a live process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process, threads that have ended included (the metrics server
    answers each request on a thread of its own; the lag poll is a thread too)."""
    return proc_status(pid)[1]


def idle_and_scrape_cost(sb, exe: str, tmp: str, seconds: float, scrapes: int) -> None:
    """(a) and (b) subscribed to an empty topic side by side: their CPU while idle (what a daemon
    costs on a quiet night), their peak RSS connected and idle, and the CPU one /metrics scrape
    costs (b) (back-to-back GETs: its CPU before and after, less its idle CPU)."""
    topic = "dm_idle"
    http_json(sb.nsqd.http_address, "/topic/create", {"topic": topic}, method="POST")
    port = free_port()
    procs = {}
    for key in ("a", "b"):
        cmd = [exe, "to-file", "-t", topic, "-c", key, "--nsqd-tcp-address", sb.nsqd.tcp_address,
               "--output-dir", f"{tmp}/idle-{key}", "--no-live"]
        if key == "b":
            cmd += ["--metrics-address", f"127.0.0.1:{port}", "--status-file", f"{tmp}/status-idle.json"]
        procs[key] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        end = time.monotonic() + 15
        while True:  # (b) is up once it answers; give both a moment more to settle
            try:
                scrape(url)
                break
            except OSError:
                if time.monotonic() > end or procs["b"].poll() is not None:
                    raise SystemExit("the idle (b) never answered /metrics")
                time.sleep(0.1)
        time.sleep(2.0)
        before = {k: cpu_seconds(p.pid) for k, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(seconds)
        took = time.monotonic() - t0
        idle = {k: (cpu_seconds(p.pid) - before[k]) * 1e3 / took for k, p in procs.items()}  # ms per s
        rss = {k: proc_status(p.pid)[0] for k, p in procs.items()}
        c0, t0 = cpu_seconds(procs["b"].pid), time.monotonic()
        size = 0
        for _ in range(scrapes):
            size = len(scrape(url))
        wall = (time.monotonic() - t0) / scrapes * 1e3
        per = (cpu_seconds(procs["b"].pid) - c0) * 1e3 / scrapes - idle["b"] * wall / 1e3
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(60)
    print(f"\nidle, subscribed to an empty topic ({seconds:.0f} s): CPU {idle['a']:.2f} ms/s (a), {idle['b']:.2f} ms/s (b); "
          f"peak RSS {rss['a']:.1f} MB (a), {rss['b']:.1f} MB (b): +{rss['b'] - rss['a']:.1f} MB, "
          f"{rss['b'] / rss['a']:.2f}x")
    print(f"one /metrics scrape of (b), {scrapes} back to back: {per:.2f} ms of its CPU, {wall:.2f} ms wall, "
          f"{size:,} bytes; at 1/s that is {per / 10:.3f}% of a core")


def scrape(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def received_total(text: bytes) -> float | None:
    total = None
    for line in text.decode().splitlines():
        if line.startswith("nsqcli_messages_received_total{"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


class Scraper(threading.Thread):
    """GET url every `every` s on a fixed cadence; counts answers and errors once the server
    first answered (connection refused while the process starts is not an error)."""

    def __init__(self, url: str, every: float):
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.stop = threading.Event()
        self.ok = self.errors = 0
        self.seconds: list[float] = []

    def run(self) -> None:
        due = time.monotonic()
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                scrape(self.url)
                self.ok += 1
                self.seconds.append(time.monotonic() - t0)
            except OSError:
                if self.ok:
                    self.errors += 1
            due = max(due + self.every, time.monotonic())
            self.stop.wait(due - time.monotonic())


def run_one(key, cmd, sb, topic, n, out: Path, mif: int, metrics_port=None, status_file=None) -> dict:
    log = tempfile.TemporaryFile()
    scraper = None
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    if key in SCRAPE_EVERY:
        scraper = Scraper(f"http://127.0.0.1:{metrics_port}/metrics", SCRAPE_EVERY[key])
        scraper.start()
    t10 = t90 = None
    try:
        while True:
            c = channel(sb, topic, "c")
            now = time.perf_counter()
            if c:
                done = c["message_count"] - c["depth"] - c["in_flight_count"]
                if t10 is None and done >= n // 10:
                    t10 = now
                if t90 is None and done >= n - n // 10:
                    t90 = now
                if c["depth"] == 0 and c["message_count"] - c["in_flight_count"] >= n - mif:
                    break
            if p.poll() is not None:
                log.seek(0)
                raise SystemExit(f"{LABEL[key]} exited early: {log.read()[-500:]!r}")
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        rss, cpu = proc_status(p.pid)
        seen = None
        if metrics_port is not None:  # the endpoint answers, and comes to the right count
            end = time.monotonic() + 5.0  # the last messages may still be in the socket's buffer
            while True:
                seen = received_total(scrape(f"http://127.0.0.1:{metrics_port}/metrics"))
                if seen == n or time.monotonic() > end:
                    break
                time.sleep(0.05)
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.join()
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    log.seek(0)
    err = log.read()
    if p.returncode != 0:
        raise SystemExit(f"{LABEL[key]} exited {p.returncode}: {err[-500:]!r}")
    records = sum(len(gzip.decompress(f.read_bytes()).splitlines()) for f in out.rglob("*.gz"))
    r = {"rate": n / elapsed, "steady": 0.8 * n / (t90 - t10) if t10 and t90 and t90 > t10 else None,
         "elapsed": elapsed, "cpu_per_m": cpu / n * 1e6, "rss": rss, "records": records}
    notes = []
    if seen is not None:
        notes.append(f"/metrics received {seen:,.0f}")
    if scraper is not None:
        med = statistics.median(scraper.seconds) * 1e3 if scraper.seconds else float("nan")
        notes.append(f"{scraper.ok} scrapes ({scraper.errors} errors, median {med:.1f} ms)")
    if status_file is not None:
        try:
            doc = json.loads(Path(status_file).read_text())
            notes.append(f"status file: {doc['state']}, finished {sum(t['finished'] for t in doc['topics']):,}")
        except (OSError, ValueError, KeyError) as e:
            notes.append(f"status file unreadable: {e}")
    steady = format(r["steady"], ",.0f") if r["steady"] else "n/a"
    bad = records != n or (metrics_port is not None and seen != n)
    print(f"  {LABEL[key]:20s} {r['rate']:>9,.0f} msg/s  steady {steady:>9s} msg/s  "
          f"{elapsed:5.2f}s  {r['cpu_per_m']:5.2f} CPU-s/M  peak RSS {rss:5.1f} MB  records {records:,}"
          + ("  " + "; ".join(notes) if notes else "") + ("  <-- WRONG COUNT" if bad else ""), flush=True)
    if bad:
        r["bad"] = True
    return r


def fmt_ratios(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs) + f" (median {statistics.median(xs):.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000,
                    help="per run; under ~500,000 a run is under 1.5 s and start-up weighs in")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the nsqcli variants rotate order each round")
    ap.add_argument("--max-in-flight", type=int, default=2500)
    ap.add_argument("--sync-interval", default="30s")
    ap.add_argument("--idle-seconds", type=float, default=20.0,
                    help="the idle stage's length (0: skip it); CPU is read in clock ticks (10 ms)")
    ap.add_argument("--scrapes", type=int, default=500, help="back-to-back scrapes to cost one")
    ap.add_argument("--no-go", action="store_true", help="skip nsq_to_file (the peer)")
    ap.add_argument("--nsqcli", help="the executable to run (default: a regular install in a scratch venv, "
                                     "as pip installs it for users)")
    a = ap.parse_args()
    n, mif = a.messages, a.max_in_flight
    results: dict[str, list[dict]] = {k: [] for k in ("go", *VARIANTS)}
    with Sandbox(NsqdOptions(mem_queue_size=n + 10), with_lookupd=False) as sb, \
            tempfile.TemporaryDirectory() as tmp:
        addr = sb.nsqd.tcp_address
        exe = a.nsqcli or str(regular_install(Path(tmp) / "venv"))
        print(f"{n:,} x 100 B, --max-in-flight {mif}, --sync-interval {a.sync_interval}, gzip; "
              f"{a.rounds} rounds; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
        common = [f"--max-in-flight={mif}", f"--sync-interval={a.sync_interval}", "--gzip"]
        for r in range(a.rounds):
            print(f"round {r + 1} (load average {os.getloadavg()[0]:.2f})", flush=True)
            order = list(VARIANTS[r % 4:] + VARIANTS[:r % 4])
            if not a.no_go:
                order = order + ["go"] if r % 2 else ["go"] + order
            topics = []
            for key in order:
                topic = f"dm_{key}{r}"
                topics.append(topic)
                out = Path(tmp) / f"{key}{r}"
                prepublish(addr, topic, n, 100)
                if key == "go":
                    cmd = [find_binary("nsq_to_file"), f"--topic={topic}", "--channel=c",
                           f"--nsqd-tcp-address={addr}", f"--output-dir={out}", *common]
                    results[key].append(run_one(key, cmd, sb, topic, n, out, mif))
                    continue
                cmd = [exe, "to-file", "-t", topic, "-c", "c", "--nsqd-tcp-address", addr,
                       "--output-dir", str(out), "--no-live", *common]
                port = status = None
                if key != "a":
                    port, status = free_port(), str(Path(tmp) / f"status-{key}{r}.json")
                    cmd += ["--metrics-address", f"127.0.0.1:{port}", "--status-file", status]
                results[key].append(run_one(key, cmd, sb, topic, n, out, mif, port, status))
            for t in topics:
                http_json(sb.nsqd.http_address, "/topic/delete", {"topic": t}, method="POST", timeout=120)
        if a.idle_seconds > 0:
            idle_and_scrape_cost(sb, exe, tmp, a.idle_seconds, a.scrapes)

    print("\nbest of each (msg/s from exec / steady 10%->90% / CPU-s per M / peak RSS MB):")
    for key in ("go", *VARIANTS):
        rs = results[key]
        if not rs:
            continue
        steady = [x["steady"] for x in rs if x["steady"]]
        print(f"  {LABEL[key]:20s} {max(x['rate'] for x in rs):>9,.0f} / {max(steady) if steady else 0:>9,.0f} / "
              f"{min(x['cpu_per_m'] for x in rs):5.2f} / {max(x['rss'] for x in rs):5.1f}  "
              f"(per round msg/s: {', '.join(format(x['rate'], ',.0f') for x in rs)})")
    base = results["a"]
    print("ratios to (a), per round (paired) and median; msg/s above 1 = faster, CPU and RSS above 1 = more:")
    for key in ("b", "c", "d"):
        rs = results[key]
        pairs = list(zip(rs, base))
        print(f"  {LABEL[key]}/(a)")
        print(f"    msg/s from exec   {fmt_ratios([x['rate'] / y['rate'] for x, y in pairs])}"
              f"; best/best {max(x['rate'] for x in rs) / max(y['rate'] for y in base):.3f}")
        if all(x["steady"] and y["steady"] for x, y in pairs):
            print(f"    steady msg/s      {fmt_ratios([x['steady'] / y['steady'] for x, y in pairs])}"
                  f"; best/best {max(x['steady'] for x in rs) / max(y['steady'] for y in base):.3f}")
        print(f"    CPU-s per M       {fmt_ratios([x['cpu_per_m'] / y['cpu_per_m'] for x, y in pairs])}")
        print(f"    peak RSS          {fmt_ratios([x['rss'] / y['rss'] for x, y in pairs])}"
              f"  (+{statistics.median([x['rss'] - y['rss'] for x, y in pairs]):.1f} MB median)")
    if results["go"]:
        pairs = list(zip(base, results["go"]))
        print(f"  (a)/nsq_to_file msg/s {fmt_ratios([x['rate'] / y['rate'] for x, y in pairs])}; "
              f"peak RSS {fmt_ratios([x['rss'] / y['rss'] for x, y in pairs])}")
        pairs = list(zip(results["b"], results["go"]))
        print(f"  (b)/nsq_to_file msg/s {fmt_ratios([x['rate'] / y['rate'] for x, y in pairs])}; "
              f"peak RSS {fmt_ratios([x['rss'] / y['rss'] for x, y in pairs])}")
    wrong = sum(1 for rs in results.values() for x in rs if x.get("bad"))
    if wrong:
        print(f"{wrong} runs had a wrong count (see <-- above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
