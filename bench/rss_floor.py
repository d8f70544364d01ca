"""Where `nsqcli to-file`'s memory goes, layer by layer, against nsq_to_file in the same run.

    .venv/bin/python -m bench.rss_floor

Each line is the RSS (VmRSS) of a fresh process of a regular install (as pip installs it for
users: bytecode compiled, no editable finder) after importing one more layer: the interpreter,
the standard library a connected archiving consumer needs, the modules the handed-off to-file
image loads (nsqcli.cli.handoff: no click), then `nsqcli to-file` itself connected to a real nsqd
and idle. For reference, what click adds to a process, and what the to-file process held
before the hand-off (click and the command's modules). The first line is nsq_to_file idle on
the same nsqd. Peak RSS under load is what bench.to_file reports; this script shows how much
of it is there before the first message.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nsqcli.sandbox import Sandbox, find_binary

from .startup import regular_install

STDLIB = ("socket, selectors, threading, logging, json, gzip, zlib, pathlib, re, signal, "
          "struct, random, collections, queue, errno, time, os")
#: what the handed-off image imports (nsqcli.entry -> nsqcli.cli.handoff -> nsqcli.cli.archiving)
NSQCLI = ("nsqcli.entry, nsqcli.cli.handoff, nsqcli.cli.archiving, nsqcli.cli.signals, nsqcli.archive.archiver, "
          "nsqcli.records, nsqcli.client.consumer")
#: what the first image holds when it hands off
CLICK = "click, nsqcli.cli.root, nsqcli.cli.commands.to_file"
RSS = "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def imported(py: str, modules: str) -> int:
    code = (f"import {modules}; " if modules else "") + RSS
    return int(subprocess.check_output([py, "-c", code], text=True).strip())


def idle(cmd: list[str], settle: float = 2.0) -> int:
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(settle)
        if p.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited early ({p.returncode})")
        return rss_kb(p.pid)
    finally:
        p.terminate()
        p.wait(30)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, Sandbox(with_lookupd=False) as sb:
        exe = regular_install(Path(tmp) / "venv")
        py = str(exe.parent / "python")
        addr = sb.nsqd.tcp_address
        go = idle([find_binary("nsq_to_file"), "--topic=rss", "--channel=c", f"--nsqd-tcp-address={addr}",
                   f"--output-dir={tmp}/go", "--gzip"])
        layers = [
            ("python -c pass", imported(py, "")),
            ("+ the stdlib a consumer needs", imported(py, STDLIB)),
            ("+ the handed-off image's modules", imported(py, f"{STDLIB}, {NSQCLI}")),
            ("nsqcli to-file, connected, idle", idle([str(exe), "to-file", "-t", "rss", "-c", "c2",
                                                      "--nsqd-tcp-address", addr, "--output-dir", f"{tmp}/ours",
                                                      "--gzip", "--no-live"])),
        ]
        print(f"{'nsq_to_file, connected, idle':34s} {go / 1024:6.1f} MB")
        for label, kb in layers:
            print(f"{label:34s} {kb / 1024:6.1f} MB  {kb / go:4.2f}x nsq_to_file")
        base = imported(py, "")
        print(f"(click alone adds {(imported(py, 'click') - base) / 1024:.1f} MB; the first image, with click "
              f"and the command, holds {imported(py, f'{STDLIB}, {NSQCLI}, {CLICK}') / 1024:.1f} MB)")
        print(f"nsq_to_file x 1.5 = {go * 1.5 / 1024:.1f} MB", flush=True)


if __name__ == "__main__":
    sys.exit(main())
