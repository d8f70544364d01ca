"""`nsqcli replay` on Spark against `nsqcli mpub --format json` of the same archive, same nsqd,
same run; `nsqcli query` count(*) group by hour over that archive.

    .venv/bin/python -m bench.replay --messages 1000000

The archive is N JSON envelopes of 100-byte bodies, gzip, in nsq_to_file-style files (what
`to-file --format json --gzip` writes). Replay is timed twice: the command's wall time, and its
publishing alone (from nsqd's first message to its last, read from /stats), at local[1] and local[2].
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nsqcli.records import envelope
from nsqcli.client.http import http_json
from nsqcli.sandbox import NsqdOptions, Sandbox

ROOT = Path(__file__).resolve().parent.parent
NSQCLI = str(ROOT / ".venv/bin/nsqcli")


class _M:
    __slots__ = ("topic", "channel", "nsqd", "id", "body", "timestamp", "attempts")


def write_archive(directory: Path, n: int, files: int = 4) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    per = n // files
    t0 = 1_795_305_600 * 10**9
    for k in range(files):
        with gzip.open(directory / f"events.bench-host-{k:06d}.2026-11-22_{k % 24:02d}.log.gz", "wt",
                       compresslevel=1) as f:
            m = _M()
            m.topic, m.channel, m.nsqd, m.attempts = "events", "c", "10.0.0.1:4150", 1
            for i in range(k * per, (k + 1) * per):
                m.id, m.timestamp = b"%016x" % i, t0 + i * 1000
                m.body = b"%010d" % i + b"x" * 90
                f.write(json.dumps(envelope(m), separators=(",", ":")) + "\n")
    return directory


def count(sb, topic: str) -> int:
    stats = http_json(sb.nsqd.http_address, "/stats", {"format": "json", "topic": topic})
    return sum(t["message_count"] for t in stats.get("topics") or [] if t["topic_name"] == topic)


def publish_window(sb, topic: str, n: int, run) -> tuple[float, float]:
    """(wall seconds of run(), seconds from the first message in nsqd to the n-th)."""
    import threading

    first = last = None
    done = threading.Event()

    def watch():
        nonlocal first, last
        while not done.is_set():
            c = count(sb, topic)
            now = time.perf_counter()
            if c and first is None:
                first = now
            if c >= n:
                last = now
                return
            time.sleep(0.02)

    w = threading.Thread(target=watch, daemon=True)
    t0 = time.perf_counter()
    w.start()
    run()
    wall = time.perf_counter() - t0
    w.join(10)  # the watcher sees the last message arrive
    done.set()
    return wall, (last - first) if first and last else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    a = ap.parse_args()
    n = a.messages
    with Sandbox(NsqdOptions(mem_queue_size=n + 10), with_lookupd=False) as sb, \
            tempfile.TemporaryDirectory() as tmp:
        addr = sb.nsqd.tcp_address
        arch = write_archive(Path(tmp) / "archive", n)
        plain = Path(tmp) / "plain.ndjson"
        with open(plain, "wb") as out:
            for f in sorted(arch.iterdir()):
                out.write(gzip.decompress(f.read_bytes()))
        print(f"{n:,} archived messages (JSON envelopes, 100 B bodies, 4 gzip files)", flush=True)

        def mpub():
            with open(plain, "rb") as f:
                subprocess.run([NSQCLI, "mpub", "-t", "r_mpub", "--format", "json", "--nsqd-tcp-address", addr],
                               stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall, pub = publish_window(sb, "r_mpub", n, mpub)
        mpub_rate = n / pub
        print(f"nsqcli mpub --format json   wall {wall:6.1f}s  publishing {n / pub:>10,.0f} msg/s", flush=True)
        rates = {}
        for master in ("local[1]", "local[2]"):
            topic = f"r_{master[6]}"

            def replay():
                subprocess.run([NSQCLI, "replay", str(arch), "-t", topic, "--nsqd-tcp-address", addr,
                                "--master", master], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            wall, pub = publish_window(sb, topic, n, replay)
            rates[master] = n / pub
            print(f"nsqcli replay {master:9s}     wall {wall:6.1f}s  publishing {n / pub:>10,.0f} msg/s "
                  f"= {n / pub / mpub_rate:.2f}x mpub (Spark start-up and reading excluded)", flush=True)
        print(f"replay scaling local[2]/local[1]: {rates['local[2]'] / rates['local[1]']:.2f}x", flush=True)
        t0 = time.perf_counter()
        subprocess.run([NSQCLI, "query", "select hour, count(*) from messages group by hour", "-a", str(arch),
                        "--master", "local[2]"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        print(f"nsqcli query count(*) group by hour: {time.perf_counter() - t0:.1f}s wall (Spark start-up included)")


if __name__ == "__main__":
    sys.exit(main())
