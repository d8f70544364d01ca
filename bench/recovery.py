"""Crash recovery of a gzip work file: time to find the last complete member.

    python -m bench.recovery --members 100000 --member-bytes 2000

Each member is one sync's worth of records (random hex, so it compresses like real bodies);
a torn member is appended, as a kill -9 mid-write leaves it."""

from __future__ import annotations

import argparse
import gzip
import os
import time

from nsqcli.archive.recovery import valid_gzip_prefix


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--member-bytes", type=int, default=2000)
    args = ap.parse_args()
    body = os.urandom(args.member_bytes // 2).hex().encode()
    member = gzip.compress(body, 1)
    data = member * args.members
    torn = data + member[: len(member) // 2]
    t = time.perf_counter()
    good = valid_gzip_prefix(torn)
    dt = time.perf_counter() - t
    assert good == len(data), (good, len(data))
    print(f"{args.members} members, {len(torn) / 1e6:.1f} MB: last complete member found in {dt:.2f}s "
          f"({len(torn) / 1e6 / dt:.0f} MB/s)")


if __name__ == "__main__":
    main()
