"""The nsq source's throughput on two pyspark versions, same run, alternated rounds:
``bench.spark --only source`` under each environment's Python (scripts/spark-env makes them).

    .venv/bin/python -m bench.spark_versions --messages 300000 --rounds 2
    .venv/bin/python -m bench.spark_versions --env .venv-spark-4.0.5 --env .venv

Each round runs one warm Spark run per environment (its first, cold run excluded), on a fresh nsqd,
then prints msg/s per version and the ratio to the first environment. The same machine, the same
messages, the same options; to-file's rate is printed too as the yardstick of each run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"spark nsq source #(\d+)\s+([\d,]+) msg/s")
TOFILE = re.compile(r"nsqcli to-file\s+([\d,]+) msg/s \(gzip, --max-in-flight 2500")


def version(env: Path) -> str:
    return subprocess.run([str(env / "bin/python"), "-c", "import pyspark; print(pyspark.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", action="append", type=Path,
                    help="a venv with pyspark and nsqcli (repeatable; default .venv-spark-4.0.5 and .venv)")
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    envs = [ROOT / e for e in (a.env or [Path(".venv-spark-4.0.5"), Path(".venv")])]
    names = [version(e) for e in envs]
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(1, a.rounds + 1):
        for env, name in zip(envs, names):
            out = subprocess.run([str(env / "bin/python"), "-m", "bench.spark", "--only", "source", "--runs", "2",
                                  "--messages", str(a.messages)], cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stdout[-2000:], out.stderr[-3000:], file=sys.stderr)
                return 1
            warm = [float(m.group(2).replace(",", "")) for m in LINE.finditer(out.stdout) if m.group(1) != "1"]
            tofile = TOFILE.search(out.stdout)
            rates[name] += warm
            print(f"round {r}: pyspark {name}: source {warm[-1]:,.0f} msg/s (warm); to-file --max-in-flight 2500 "
                  f"{tofile.group(1) if tofile else '?'} msg/s in the same run", flush=True)
    base = names[0]
    for name in names:
        best = max(rates[name])
        print(f"pyspark {name}: best {best:,.0f} msg/s, rounds {', '.join(f'{x:,.0f}' for x in rates[name])}; "
              f"ratio to {base}: {best / max(rates[base]):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
