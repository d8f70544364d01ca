"""The README's five-minute tour runs as written, in bash, with the installed `nsqcli` on PATH."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import clean_env

ROOT = Path(__file__).resolve().parent.parent


def tour_block() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- tour -->\n```sh\n(.*?)```\n<!-- /tour -->", text, re.S)
    assert m, "README.md lost its tour block"
    return m.group(1)


def test_five_minute_tour_runs_as_written(tmp_path):
    bindir = Path(sys.executable).parent
    assert (bindir / "nsqcli").exists(), "the nsqcli entry point is not installed next to this Python"
    env = clean_env({"PATH": f"{bindir}:{os.environ['PATH']}", "NSQCLI_CONFIG_DIR": str(tmp_path / "cfg")})
    r = subprocess.run(["bash", "-e", "-c", tour_block()], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[-1] == "channels: tour"
    spark = 1 if importlib.util.find_spec("pyspark") else 0  # doctor's last check: the installed pyspark
    assert "hello" in out and "998" in out and f"{5 + spark} ok, 0 warnings, 0 failed" in out
    assert any(re.match(r"^events/tour\s+0\s+0 \|\s+0 .* 1001\s+0$", ln) for ln in out), r.stdout
    assert "Traceback" not in r.stderr
    pid = int(re.search(r"sandbox running in the background, pid (\d+)", r.stderr).group(1))
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        import time

        time.sleep(0.1)
    else:
        raise AssertionError("the tour's sandbox is still running after kill $NSQCLI_SANDBOX_PID")
