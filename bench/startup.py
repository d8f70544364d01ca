"""`nsqcli pub` start-up: one message to a real nsqd, from exec to exit, against `python -c pass`
measured in the same run (interleaved, N runs each: min / median / max).

    python -m bench.startup [--runs 40] [--nsqcli PATH]

By default it measures a REGULAR (non-editable) install: a scratch venv with `pip install
--no-deps` of this checkout (bytecode compiled by pip), its dependencies taken from this
interpreter's site-packages through a path file. An editable install's import finder alone
costs ~12 ms at start-up, which users of pip/pipx never pay. --nsqcli measures a given
executable instead (e.g. .venv/bin/nsqcli, the editable one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from nsqcli.sandbox import Sandbox

ROOT = Path(__file__).resolve().parent.parent


def regular_install(where: Path) -> Path:
    """A venv with this checkout installed as pip installs it for users; returns its nsqcli."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    (site / "_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")  # click, rich, snappy; not our .pth files
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(ROOT)], check=True,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return where / "bin" / "nsqcli"


def measure(cmds: dict[str, list[str]], runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in cmds}
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQCLI_")}
    env["NSQCLI_CONFIG_DIR"] = tempfile.mkdtemp()  # no saved context
    for _ in range(runs):
        for key, cmd in cmds.items():  # interleaved: load from other processes hits both alike
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            times[key].append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--nsqcli", help="the executable to time (default: a regular install in a scratch venv)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Sandbox(with_lookupd=False) as sb:
        exe = args.nsqcli or str(regular_install(Path(tmp) / "venv"))
        python = str(Path(exe).parent / "python") if not args.nsqcli else sys.executable
        cmds = {"python -c pass": [python, "-c", "pass"],
                "nsqcli pub": [exe, "pub", "-t", "startup", "--nsqd-tcp-address", sb.nsqd.tcp_address, "hi"]}
        measure(cmds, 2)  # warm the page cache and bytecode
        times = measure(cmds, args.runs)
    print(f"{'':16s} {'min':>8s} {'median':>8s} {'max':>8s}   ({args.runs} runs each, "
          f"{'regular install' if not args.nsqcli else exe})")
    for key, t in times.items():
        print(f"{key:16s} {min(t) * 1000:7.1f}ms {statistics.median(t) * 1000:7.1f}ms {max(t) * 1000:7.1f}ms")


if __name__ == "__main__":
    main()
