"""Where a run's CPU goes, by kind of process: ``python -m bench.ci_cpu -- make test``.

Runs COMMAND and reads /proc every --interval (0.25 s) for every process on the machine: its
CPU time (user + system) and what it runs, taken again when its name changes (a forked
``spark-submit`` becomes a ``java``). Prints CPU-seconds by kind - the Spark JVMs by role and
pyspark, Spark's Python daemons and workers, the streaming source runners, pytest's workers,
nsqcli run as a program, nsqd/nsqlookupd - then the run's wall time and the machine's busy
CPU over it (/proc/stat). What the sampler saw is less than the busy CPU by what lived
shorter than an interval, and by what else the machine did meanwhile (nothing, on a quiet
one). Linux only; stdlib only. The test passes' figures in bench/figures.md come from it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def busy_cpu() -> float:
    """CPU-seconds the machine has spent not idle since boot."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / TICK


def kind(cmd: str) -> str:
    """The kind of process a command line is."""
    exe = cmd.split(" ", 1)[0]
    if exe.endswith("/java") or exe == "java":
        lts = " (" + (m.group(1) if (m := re.search(r"venv-spark-([\d.]+)", cmd)) else "main venv") + ")"
        for role, name in (("SparkConnectServer", "connect server"), ("deploy.master", "master"),
                           ("deploy.worker", "worker"), ("CoarseGrainedExecutorBackend", "executor")):
            if role in cmd:
                return f"java {name}{lts}"
        return f"java driver{lts}"
    if m := re.search(r"-m pyspark\.(daemon|worker)\b(?: (\S+))?", cmd):  # a daemon names its workers' module
        module = (m.group(2) or "").rsplit(".", 1)[-1]
        return f"pyspark {m.group(1)}" + (f" ({module})" if module else "")
    if m := re.search(r"-m (pyspark\.\S+)", cmd):
        return m.group(1).rsplit(".", 1)[-1]
    if "execnet" in cmd or "exec(eval(sys.stdin" in cmd or "pytest" in cmd:
        return "pytest"
    if "-m nsqcli" in cmd or "/bin/nsqcli" in cmd:
        return "nsqcli (program)"
    base = os.path.basename(exe)
    if base in ("nsqd", "nsqlookupd"):
        return "nsqd/nsqlookupd"
    if base.startswith("python"):
        return "python (other)"
    return base or "?"


def sample(stop: threading.Event, interval: float, skip: set[int]) -> dict:
    """{(pid, start time): [first CPU, last CPU, comm, cmdline]} until ``stop``."""
    seen: dict = {}
    first = True
    while not stop.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) in skip:
                continue
            try:
                st = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            comm = st[st.find("(") + 1:st.rfind(")")]
            f = st[st.rfind(")") + 2:].split()
            cpu = (int(f[11]) + int(f[12])) / TICK
            row = seen.get((pid, f[19]))
            if row is None:
                row = seen[(pid, f[19])] = [cpu if first else 0.0, cpu, None, ""]
            row[1] = max(row[1], cpu)
            if row[2] != comm:  # new, or exec()ed into something else
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    cmd = ""
                if cmd:
                    row[2], row[3] = comm, cmd.strip()
        first = False
        stop.wait(interval)
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ci_cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between looks at /proc")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the run to measure (after --)")
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("give the command to run after --")
    stop = threading.Event()
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(sample(stop, a.interval, {os.getpid()})), daemon=True)
    b0, w0 = busy_cpu(), time.monotonic()
    t.start()
    rc = subprocess.call(command)
    stop.set()
    t.join()
    wall, busy = time.monotonic() - w0, busy_cpu() - b0
    by: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for first, last, _, cmd in result.values():
        k = kind(cmd) if cmd else "(no command line: kernel threads, gone before a look)"
        by[k] += last - first
        count[k] += 1
    seen = sum(by.values())
    out = [f"{'CPU-s':>8} {'share':>6} {'procs':>6}  kind"]
    out += [f"{v:8.1f} {100 * v / max(seen, 1e-9):5.1f}% {count[k]:6d}  {k}" for k, v in by.most_common() if v >= 0.05]
    out.append(f"{seen:8.1f} seen by the sampler; the machine was busy {busy:.1f} CPU-s over {wall:.1f} s "
               f"({busy / wall / (os.cpu_count() or 1):.0%} of {os.cpu_count()} cores); exit {rc}")
    print("\n".join(out), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
