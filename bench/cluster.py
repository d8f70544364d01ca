"""Cluster bench (issue 32, part 6): nsqcli and the official Go tools against one NSQ cluster on
loopback, in one run.

    .venv/bin/python -m bench.cluster --nodes 10 --topics 50            # quick (~1 min)
    .venv/bin/python -m bench.cluster --nodes 10,20,40 --topics 200     # the issue's sizes

For each N it starts 2 nsqlookupd and N nsqd (v1.3.0, 127.0.0.1, free ports, temporary data
dirs, every nsqd registered with both lookupds) after checking memory: one nsqd is started
alone with one node's share of the load and its RSS measured; N of those plus the tools must
fit in --mem-fraction of MemAvailable, or the size is refused with one line. Then:

- T topics ``cb_000``.. each on ``--spread`` nodes (default N/4, at least 2: round-robin), plus
  ``cb_tail`` on every node. Every channel a tool will read is created on every node before
  anything is published, so each tool reads every message; then K messages per topic (split
  over its nodes) and ``--tail-messages`` on cb_tail are published with nsqd's HTTP /mpub. One
  to-file channel sees T*spread + N connections: 410 / 1,020 / 2,040 at N = 10 / 20 / 40.
- **to-file**: ``nsqcli to-file --topic-pattern '.*'`` vs ``nsq_to_file --topic-pattern=.*``,
  both with two --lookupd-http-address, ``--topic-refresh 1s`` (nsq_to_file's first look for
  topics comes one refresh after its start: a minute by default) and ``--sync-interval 1s``
  (nsq_to_file syncs and FINs a batch early only while a connection is starved - >= 85 % of
  its RDY in flight - so a topic's last partial batch waits a whole interval, 30 s by default),
  each on a channel of its own, one after the other.
  *ramp*: from start until the nsqd /stats (all nodes, every ~100 ms) count every expected
  connection on the tool's channel. *drain*: until every node shows depth + in_flight +
  deferred == 0 on it, message_count == everything published, and the files in the output dir
  hold that many lines; then SIGTERM. *archived*: lines and distinct lines after exit.
- **tail**: ``nsqcli tail cb_tail -n 1000 --max-in-flight 5`` vs ``nsq_tail`` (same flags) over
  cb_tail on all N nodes, each on a named channel created before publishing: wall time.
- **stat**: two nsqd stopped with SIGSTOP (SIGCONT in a finally), ``nsqcli stat --json`` vs
  ``nsq_stat`` on cb_tail, --interval 2s, 4 reports: time to the first report line and the
  median time between reports.
- **ulimit** (at N = --ulimit-nodes only, 10): to-file of both tools again on fresh channels,
  started with RLIMIT_NOFILE's soft limit at 1024 (hard limit left): archived or not, exit code,
  last stderr line.

For every tool run, a sampler reads /proc every ~100 ms over the tool's process tree (children
included): peak threads (``Threads:``), peak fds (entries in /proc/PID/fd; as the count grows
they are classified by readlink - at most once a second or after 10 % more - and "fds per
connection" counts only sockets, pipes and anon inodes, files excluded, over the expected
connections) and peak RSS (sum of VmRSS, or VmHWM if higher); peaks of a run shorter than
~0.5 s read "(too short)". The bench's own CPU while each tool ran is printed beside it. Each tool run has a hard limit (--phase-timeout); past it the tool's process group is
killed and its row says "timeout". Everything started here is stopped here, by pid, in finally
blocks (SIGTERM to this bench too). Tables go to stdout, one per N, with nsqcli / Go ratios
(below 1: nsqcli uses less or is faster); bench/results/cluster.json keeps the numbers and
bench/results/cluster_logs/ each tool's stderr. Times come from polls every ~100 ms (a tail's
wall time from its exit); one run per figure, on a shared machine: expect run-to-run spread.

nsqcli is whatever ``.venv/bin/nsqcli`` runs now (--nsqcli: another executable; --ref REF:
nsqcli/ as committed at REF, for figures of a known commit while the tree is being edited).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from nsqcli.sandbox import find_binary

from .cluster_rig import Child, Cluster, Http, proc_status, start_server

ROOT = Path(__file__).resolve().parent.parent
TAIL_TOPIC = "cb_tail"
TOOLS = ("nsqcli", "go")
PHASES = ("to-file", "ulimit", "tail", "stat")  # stat last: it stops two nodes
GO_NAMES = {"to-file": "nsq_to_file", "tail": "nsq_tail", "stat": "nsq_stat", "ulimit": "nsq_to_file"}


# -- the plan: which topic lives where, what each node holds ---------------------------------

@dataclass(frozen=True)
class Plan:
    nodes: int
    topics: int
    spread: int
    per_topic: int
    tail_messages: int

    def topic_nodes(self, i: int) -> list[int]:
        """Topic i's nodes: ``spread`` consecutive ones, round-robin over the cluster."""
        return [(i * self.spread + j) % self.nodes for j in range(self.spread)]

    def layout(self) -> dict[int, list[tuple[str, int]]]:
        """node -> [(topic, messages published to it there)]: K per topic split over its nodes."""
        out: dict[int, list[tuple[str, int]]] = {n: [] for n in range(self.nodes)}
        for i in range(self.topics):
            for j, node in enumerate(self.topic_nodes(i)):
                out[node].append((f"cb_{i:03d}", share(self.per_topic, self.spread, j)))
        for node in range(self.nodes):
            out[node].append((TAIL_TOPIC, share(self.tail_messages, self.nodes, node)))
        return out

    @property
    def connections(self) -> int:
        """Connections one lookupd consumer of every topic makes (one per topic per node)."""
        return self.topics * self.spread + self.nodes

    @property
    def messages(self) -> int:
        return self.topics * self.per_topic + self.tail_messages


def share(total: int, parts: int, j: int) -> int:
    """Part j of ``total`` split as evenly as integers allow."""
    return total // parts + (1 if j < total % parts else 0)


def body(topic: str, node: int, seq: int) -> bytes:
    """100 bytes, unique in the whole run (so the archive's distinct lines can be counted)."""
    return f"{topic} n{node} {seq:08d} ".ljust(100, "x").encode()


# -- the load: topics, channels, messages ------------------------------------------------------

def populate_node(h: Http, load: list[tuple[str, int]], node: int, channels: dict[str, list[str]]) -> None:
    """Create the node's topics and their channels, then publish its messages (/mpub)."""
    for topic, count in load:
        h.post("/topic/create", topic=topic)
        for ch in channels["all"] + (channels["tail"] if topic == TAIL_TOPIC else []):
            h.post("/channel/create", topic=topic, channel=ch)
        for start in range(0, count, 5000):
            lines = b"\n".join(body(topic, node, s) for s in range(start, min(count, start + 5000)))
            h.post("/mpub", lines, topic=topic)


def populate(cl: Cluster, plan: Plan, channels: dict[str, list[str]]) -> None:
    layout = plan.layout()
    cl.each_node(lambda n, h: populate_node(h, layout[n], n, channels))
    wait_registered(cl, layout)


def wait_registered(cl: Cluster, layout: dict[int, list[tuple[str, int]]], limit: float = 30.0) -> None:
    """Until both lookupds list every node with all its topics (discovery reads them)."""
    want = {(cl.nsqds[n].tcp_address.rsplit(":", 1)[1], t) for n, load in layout.items() for t, _ in load}
    deadline = time.monotonic() + limit
    for lk in cl.lookupds:
        h = Http(lk.http_address)
        while True:
            nodes = h.json("/nodes").get("producers") or []
            have = {(str(p["tcp_port"]), t) for p in nodes for t in p.get("topics") or []}
            if want <= have:
                break
            if time.monotonic() > deadline:
                ports = sorted({port for port, _ in want - have})
                dead = [s.tcp_address for s in cl.nsqds if not s.running]
                raise SystemExit(f"bench.cluster: {lk.http_address} lists {len(want & have)} of {len(want)} "
                                 f"node/topic registrations after {limit:g} s; missing nsqd TCP ports {ports[:5]}; "
                                 f"exited nsqd: {dead or 'none'}")
            time.sleep(0.2)
        h.close()


# -- memory check ------------------------------------------------------------------------------

def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("bench.cluster: no MemAvailable in /proc/meminfo")


def loaded_nsqd_mb(plan: Plan, channels: dict[str, list[str]], base: Path) -> float:
    """RSS of one nsqd, alone, holding node 0's share of the plan (topics, channels, messages)."""
    probe = start_server("nsqd", base, f"probe{plan.nodes}", node_id=1023)
    try:
        h = Http(probe.http_address)
        populate_node(h, plan.layout()[0], 0, channels)
        h.close()
        time.sleep(0.5)
        return proc_status(probe.pid, "VmRSS") / 1024
    finally:
        probe.stop()


def check_memory(plan: Plan, node_mb: float, fraction: float) -> str:
    """One line saying what N nodes need; SystemExit if that is more than ``fraction`` of
    MemAvailable. Each nsqd: the probe's RSS x 1.5 (heap growth) + 50 KB per client connection;
    the tool under test: 256 MB + 256 KB per connection (a thread per connection today)."""
    conns = plan.connections
    need = plan.nodes * node_mb * 1.5 + conns * 0.05 + 256 + conns * 0.25
    avail = mem_available_mb()
    line = (f"memory: one loaded nsqd {node_mb:.0f} MB; N={plan.nodes} needs ~{need:,.0f} MB; "
            f"MemAvailable {avail:,.0f} MB (may use {fraction:.0%})")
    if need > avail * fraction:
        raise SystemExit(f"bench.cluster: refusing N={plan.nodes}: {line}")
    return line


# -- the phases ---------------------------------------------------------------------------------

def archive_lines(outdir: Path, distinct: bool = False) -> tuple[int, int | None]:
    """(lines, distinct lines or None) in every file under ``outdir``."""
    lines, seen = 0, set()
    for f in outdir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            lines += data.count(b"\n")
            if distinct:
                seen.update(data.splitlines())
    return lines, (len(seen) if distinct else None)


def run_to_file(cl: Cluster, plan: Plan, cmd: list[str], channel: str, outdir: Path, limit: float,
                nofile: int | None = None) -> dict:
    """Start a to-file; ramp and drain as the module docstring says; SIGTERM once drained."""
    before = cl.channel_totals(channel)
    if before["pending"] != plan.messages:
        raise SystemExit(f"bench.cluster: channel {channel} holds {before['pending']} messages, "
                         f"{plan.messages} were published")
    res: dict = {"ramp_s": None, "drain_s": None, "max_conns": 0}
    polls: list[float] = []
    with Child(cmd, outdir.parent / f"{outdir.name}.stderr", nofile=nofile) as ch:
        while True:
            t = time.monotonic()
            now, tot = ch.elapsed(), cl.channel_totals(channel)
            polls.append(time.monotonic() - t)
            res["max_conns"] = max(res["max_conns"], tot["clients"])
            if res["ramp_s"] is None and tot["clients"] >= plan.connections:
                res["ramp_s"] = now
            if (tot["pending"] == 0 and tot["messages"] >= plan.messages
                    and archive_lines(outdir)[0] >= plan.messages):
                res["drain_s"] = now
                break
            if not ch.running() or now > limit:
                break
            ch.wait_tick(t)
        res["timeout"] = ch.running() and res["drain_s"] is None
        res["rc"] = "killed (timeout)" if res["timeout"] else ch.terminate()
    res.update(ch.peaks, stderr=ch.stderr_tail(), poll_ms=statistics.median(polls) * 1000)
    res["lines"], res["distinct"] = archive_lines(outdir, distinct=True)
    return res


def run_tail(cl: Cluster, plan: Plan, cmd: list[str], channel: str, workdir: Path, name: str,
             limit: float) -> dict:
    """Wall time of a bounded tail (it exits by itself after -n messages); ramp to N conns."""
    out_path = workdir / f"{name}.stdout"
    res: dict = {"ramp_s": None, "wall_s": None}
    with open(out_path, "wb") as out, Child(cmd, workdir / f"{name}.stderr", stdout=out) as ch:
        while ch.running() and ch.elapsed() < limit:
            t = time.monotonic()
            if res["ramp_s"] is None and cl.channel_totals(channel)["clients"] >= plan.nodes:
                res["ramp_s"] = ch.elapsed()
            ch.wait_tick(t)
        res["timeout"] = ch.running()
        if not res["timeout"]:
            res["wall_s"] = ch.elapsed()
        res["rc"] = "killed (timeout)" if res["timeout"] else ch.proc.returncode
    res.update(ch.peaks, stderr=ch.stderr_tail(), lines=out_path.read_bytes().count(b"\n"))
    return res


def nsq_stat_report(line: str) -> bool:
    """A data line of nsq_stat (numbers; its headers start with '-' or column names)."""
    return bool(re.match(r"\s*[\d.]+\s+[\d.]+\s+\|", line))


def run_stat(cmd: list[str], workdir: Path, name: str, is_report, limit: float) -> dict:
    """Time of each report line on stdout: the first one, and the median gap between them."""
    stamps: list[float] = []
    res: dict = {"first_s": None, "refresh_s": None, "exit_s": None}
    with Child(cmd, workdir / f"{name}.stderr", stdout=subprocess.PIPE) as ch:
        def read() -> None:
            for raw in ch.proc.stdout:
                if is_report(raw.decode(errors="replace")):
                    stamps.append(ch.elapsed())
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            ch.proc.wait(limit)
            res["exit_s"] = ch.elapsed()
        except subprocess.TimeoutExpired:
            pass
        res["timeout"] = ch.running()
        res["rc"] = "killed (timeout)" if res["timeout"] else ch.proc.returncode
    reader.join(5)
    res.update(ch.peaks, stderr=ch.stderr_tail(), reports=len(stamps))
    if stamps:
        res["first_s"] = stamps[0]
    if len(stamps) > 1:
        res["refresh_s"] = statistics.median(b - a for a, b in itertools.pairwise(stamps))
    return res


# -- the commands --------------------------------------------------------------------------------

def lookupd_flags(cl: Cluster, go: bool) -> list[str]:
    if go:
        return [f"--lookupd-http-address={a}" for a in cl.lookupd_addresses()]
    return [x for a in cl.lookupd_addresses() for x in ("--lookupd-http-address", a)]


def to_file_cmd(tool: str, nsqcli: str, cl: Cluster, channel: str, outdir: Path, args) -> list[str]:
    """Both tools get the bench's --topic-refresh and --sync-interval (see the docstring)."""
    if tool == "go":
        return [find_binary("nsq_to_file"), "--topic-pattern=.*", f"--channel={channel}", f"--output-dir={outdir}",
                f"--topic-refresh={args.topic_refresh}", f"--sync-interval={args.sync_interval}",
                *lookupd_flags(cl, True)]
    return [nsqcli, "to-file", "--topic-pattern", ".*", "-c", channel, "--output-dir", str(outdir),
            "--topic-refresh", args.topic_refresh, "--sync-interval", args.sync_interval, *lookupd_flags(cl, False)]


def tail_cmd(tool: str, nsqcli: str, cl: Cluster, channel: str, count: int) -> list[str]:
    if tool == "go":
        return [find_binary("nsq_tail"), f"--topic={TAIL_TOPIC}", f"--channel={channel}", "-n", str(count),
                "--max-in-flight=5", *lookupd_flags(cl, True)]
    return [nsqcli, "tail", TAIL_TOPIC, "-c", channel, "-n", str(count), "--max-in-flight", "5",
            *lookupd_flags(cl, False)]


def stat_cmd(tool: str, nsqcli: str, cl: Cluster, channel: str, reports: int) -> list[str]:
    if tool == "go":
        return [find_binary("nsq_stat"), f"--topic={TAIL_TOPIC}", f"--channel={channel}", "--interval=2s",
                f"--count={reports}", *lookupd_flags(cl, True)]
    return [nsqcli, "stat", TAIL_TOPIC, channel, "--interval", "2s", "-n", str(reports), "--json",
            *lookupd_flags(cl, False)]


def channels_for(phases: list[str]) -> dict[str, list[str]]:
    """Channels to create before publishing: on every topic, on cb_tail only."""
    every = [f"tofile_{t}" for t in TOOLS] if "to-file" in phases else []
    every += [f"ulimit_{t}" for t in TOOLS] if "ulimit" in phases else []
    return {"all": every, "tail": [f"tail_{t}" for t in TOOLS]}


def run_phases(cl: Cluster, plan: Plan, phases: list[str], args, work: Path) -> dict:
    """Every phase, nsqcli then the Go tool, one at a time: {phase: {tool: result}}."""
    out: dict[str, dict] = {}
    for phase in phases:
        out[phase] = {}
        for tool in TOOLS:
            print(f"  {phase:8s} {tool if tool == 'nsqcli' else GO_NAMES[phase]} ...", end="", flush=True)
            out[phase][tool] = run_one(cl, plan, phase, tool, args, work)
            print(f" {summary(phase, out[phase][tool])}", flush=True)
    return out


def run_one(cl: Cluster, plan: Plan, phase: str, tool: str, args, work: Path) -> dict:
    exe, limit, name = args.nsqcli, args.phase_timeout, f"{phase}_{tool}"
    if phase in ("to-file", "ulimit"):
        channel = f"{'tofile' if phase == 'to-file' else 'ulimit'}_{tool}"
        (work / name).mkdir()
        return run_to_file(cl, plan, to_file_cmd(tool, exe, cl, channel, work / name, args), channel, work / name,
                           limit, nofile=1024 if phase == "ulimit" else None)
    if phase == "tail":
        return run_tail(cl, plan, tail_cmd(tool, exe, cl, f"tail_{tool}", args.tail_count), f"tail_{tool}",
                        work, name, limit)
    stopped = cl.nsqds[:2]
    try:
        for s in stopped:
            os.kill(s.pid, signal.SIGSTOP)
        is_report = nsq_stat_report if tool == "go" else (lambda line: line.startswith("{"))
        return run_stat(stat_cmd(tool, exe, cl, "tail_go", args.stat_reports), work, name, is_report, limit)
    finally:
        for s in stopped:
            os.kill(s.pid, signal.SIGCONT)


# -- the report ----------------------------------------------------------------------------------

def fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}{unit}" if v < 100 else f"{v:,.0f}{unit}"
    return f"{v:,}{unit}" if isinstance(v, int) else str(v)


def timed(res: dict, key: str):
    """A time, or why there is none."""
    if res.get(key) is not None:
        return res[key]
    if res.get("timeout"):
        return "timeout"
    return "(ended first)" if res.get("rc") == 0 else f"none (exit {res.get('rc')})"


NO_RATIO = {"exit", "connections seen (max)", "reports", "lines out", "archived lines / distinct"}


def ratio(label: str, a, b) -> str:
    ok = label not in NO_RATIO and isinstance(a, (int, float)) and isinstance(b, (int, float)) and b
    return f"{a / b:.2f}x" if ok else ""


def summary(phase: str, r: dict) -> str:
    key = {"to-file": "drain_s", "ulimit": "drain_s", "tail": "wall_s", "stat": "first_s"}[phase]
    return f"{fmt(timed(r, key))} s, exit {r.get('rc')}"


def rows_for(phase: str, r: dict, plan: Plan) -> list[tuple[str, object]]:
    """(label, value) rows of one tool's result."""
    conns = plan.connections if phase in ("to-file", "ulimit") else plan.nodes
    short = r["samples"] < 5  # a run under ~0.5 s: the peaks would be its start-up's
    common = [("threads (peak)", r["threads"]), ("fds (peak)", r["fds"]),
              ("fds per connection (no files)", round(r["conn_fds"] / conns, 2)),
              ("peak RSS MB", round(r["rss_mb"], 1))]
    if short:
        common = [(label, "(too short)") for label, _ in common]
    if phase in ("to-file", "ulimit"):
        return [("connection ramp s", timed(r, "ramp_s")), ("time to drain s", timed(r, "drain_s")),
                ("connections seen (max)", r["max_conns"]), *common,
                ("archived lines / distinct", f"{r['lines']:,} / {r['distinct']:,}"), ("exit", r["rc"])]
    if phase == "tail":
        return [("wall s", timed(r, "wall_s")), ("connection ramp s", timed(r, "ramp_s")), *common,
                ("lines out", r["lines"]), ("exit", r["rc"])]
    return [("first report s", timed(r, "first_s")), ("per refresh s (median)", r["refresh_s"]),
            ("reports", r["reports"]), ("exits after s", r["exit_s"]), ("threads (peak)", r["threads"]),
            ("exit", r["rc"])]


def titles(plan: Plan, args) -> dict[str, str]:
    return {"to-file": f"to-file --topic-pattern '.*': {plan.connections:,} connections, {plan.messages:,} messages",
            "ulimit": f"to-file under ulimit -Sn 1024 (hard {resource.getrlimit(resource.RLIMIT_NOFILE)[1]} left)",
            "tail": f"tail {TAIL_TOPIC} -n {args.tail_count} --max-in-flight 5, topic on all {plan.nodes} nodes",
            "stat": f"stat {TAIL_TOPIC}, 2 of {plan.nodes} nsqd SIGSTOPped, --interval 2s, {args.stat_reports} reports"}


def print_tables(plan: Plan, results: dict, args) -> None:
    for phase, by_tool in results.items():
        ours, go = by_tool["nsqcli"], by_tool["go"]
        print(f"\n{titles(plan, args)[phase]}\n  {'(nsqcli/Go below 1: nsqcli less or faster)':42s} "
              f"{'nsqcli':>8s} {GO_NAMES[phase]:>18s} {'nsqcli/Go':>10s}")
        go_rows = dict(rows_for(phase, go, plan))
        for label, v in rows_for(phase, ours, plan):
            g = go_rows[label]
            print(f"  {label:32s} {fmt(v):>18s} {fmt(g):>18s} {ratio(label, v, g):>10s}")
        for tool, r in by_tool.items():
            if r["stderr"] and (phase == "ulimit" or r["rc"] not in (0, -15)):
                print(f"  {tool} stderr's last line: {r['stderr']}")
        polls = "; median /stats round " + " / ".join(f"{r['poll_ms']:.0f}" for r in (ours, go)) + " ms" \
            if "poll_ms" in ours else ""
        print(f"  (the bench's own CPU while each ran: {ours['bench_cpu']:.2f} / {go['bench_cpu']:.2f} cores{polls})")


# -- main ------------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="10", help="comma-separated cluster sizes, e.g. 10,20,40")
    ap.add_argument("--topics", type=int, default=200)
    ap.add_argument("--messages-per-topic", type=int, default=500, help="K, split over the topic's nodes")
    ap.add_argument("--spread", type=int, help="nodes per topic (default: N/4, at least 2)")
    ap.add_argument("--tail-messages", type=int, default=2000, help="published to cb_tail (over all nodes)")
    ap.add_argument("--tail-count", type=int, default=1000, help="tail -n")
    ap.add_argument("--stat-reports", type=int, default=4)
    ap.add_argument("--only", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    ap.add_argument("--ulimit-nodes", type=int, default=10, help="the N at which the ulimit phase runs")
    ap.add_argument("--phase-timeout", type=float, default=120.0, help="hard limit per tool run, seconds")
    ap.add_argument("--mem-fraction", type=float, default=0.5, help="of MemAvailable the cluster may use")
    ap.add_argument("--topic-refresh", default="1s",
                    help="to-file --topic-refresh for both tools (nsq_to_file's first look is after one)")
    ap.add_argument("--sync-interval", default="1s",
                    help="to-file --sync-interval for both tools (nsq_to_file syncs a partial batch only then)")
    ap.add_argument("--nsqcli", default=str(ROOT / ".venv" / "bin" / "nsqcli"), help="the executable to run")
    ap.add_argument("--ref", help="run nsqcli as committed at this git ref instead (exported with git archive, "
                                  "run by the venv's python): figures of a known commit while nsqcli/ is edited")
    args = ap.parse_args()
    args.nodes = [int(n) for n in args.nodes.split(",")]
    only = {p.strip() for p in args.only.split(",")}
    bad, args.only = only - set(PHASES), [p for p in PHASES if p in only]
    if bad or not 3 <= min(args.nodes) <= max(args.nodes) <= 1000:
        ap.error(f"unknown phase {sorted(bad)}" if bad else "--nodes: 3 (stat stops 2) to 1000 (nsqd's --node-id)")
    return args


def plans(args) -> list[tuple[Plan, list[str]]]:
    """(plan, phases) for each N asked for."""
    return [(Plan(n, args.topics, args.spread or max(2, n // 4), args.messages_per_topic, args.tail_messages),
             [p for p in args.only if p != "ulimit" or n == args.ulimit_nodes]) for n in args.nodes]


def check_all(sizes: list[tuple[Plan, list[str]]], args, tmp: Path) -> None:
    """Every size's memory check before anything runs (a refusal leaves no size half done)."""
    for plan, phases in sizes:
        print(check_memory(plan, loaded_nsqd_mb(plan, channels_for(phases), tmp), args.mem_fraction), flush=True)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def keep_logs(work: Path, n: int) -> None:
    """Each tool's stderr, to bench/results/cluster_logs/nN/ (the temporary dir goes away)."""
    dest = ROOT / "bench" / "results" / "cluster_logs" / f"n{n}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in work.glob("*.stderr"):
        shutil.copy(f, dest)


def one_size(plan: Plan, phases: list[str], args, work: Path) -> dict:
    print(f"\n== N={plan.nodes} nsqd, 2 nsqlookupd, {plan.topics} topics on {plan.spread} nodes each + {TAIL_TOPIC} "
          f"on all, {plan.per_topic} msg/topic + {plan.tail_messages} on {TAIL_TOPIC} = {plan.messages:,} messages",
          flush=True)
    cl = Cluster(plan.nodes, work)
    try:
        t0 = time.monotonic()
        cl.start()
        populate(cl, plan, channels_for(phases))
        print(f"cluster up and populated in {time.monotonic() - t0:.1f} s; load average {load()} "
              f"on {os.cpu_count()} CPUs (other work on the machine shows here)", flush=True)
        results = run_phases(cl, plan, phases, args, work)
    finally:
        cl.stop()
        keep_logs(work, plan.nodes)
    print_tables(plan, results, args)
    return {"plan": plan.__dict__, "connections": plan.connections, "results": results}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def measured(args) -> str:
    """What nsqcli is: a commit, and whether the working tree's nsqcli/ differs from it."""
    if args.ref:
        return f"{args.ref[:7]} (nsqcli/ exported with git archive)"
    dirty = git("status", "--porcelain", "--", "nsqcli")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes in nsqcli/" if dirty else "")


def nsqcli_at(ref: str, tmp: Path) -> str:
    """An executable running nsqcli/ as committed at ``ref`` (PYTHONPATH comes before the
    editable install's finder); to-file's hand-off re-runs the same argv and environment."""
    src = tmp / "src"
    src.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "nsqcli"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
    exe = tmp / "nsqcli"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={src} exec {ROOT / ".venv" / "bin" / "python"} -P -m nsqcli "$@"\n')
    exe.chmod(0o755)
    check = f"import nsqcli; assert nsqcli.__file__.startswith({str(src)!r}), nsqcli.__file__"
    subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-P", "-c", check], env={**os.environ, "PYTHONPATH": str(src)},
                   check=True)
    return str(exe)


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    if args.ref:
        args.ref = git("rev-parse", "--verify", args.ref + "^{commit}")  # one commit, even if HEAD moves
    everything = {"nsqcli": measured(args), "argv": sys.argv[1:], "sizes": {}}
    sizes = plans(args)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        if args.ref:
            args.nsqcli = nsqcli_at(args.ref, Path(tmp))
        print(f"bench.cluster: nsqcli at {everything['nsqcli']} ({args.nsqcli}); "
              f"hard limit {args.phase_timeout:g} s per tool run", flush=True)
        check_all(sizes, args, Path(tmp))
        for plan, phases in sizes:
            (Path(tmp) / f"n{plan.nodes}").mkdir()
            everything["sizes"][plan.nodes] = one_size(plan, phases, args, Path(tmp) / f"n{plan.nodes}")
    out = ROOT / "bench" / "results" / "cluster.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(everything, indent=1, default=str))
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
