"""--metrics-address loads prometheus_client without python-snappy's cramjam (1.7 MB of a
daemon's RSS, bench/daemon_metrics.py), and snappy still imports afterwards for --snappy."""

import subprocess
import sys

PROBE = r"""
import sys, urllib.request
from nsqcli.daemon.metrics import serve
srv = serve("127.0.0.1:0", lambda: {"command": "to-file", "pid": 1, "topics": [], "health": {"ok": True}})
body = urllib.request.urlopen(f"http://{srv.address}/metrics", timeout=5).read().decode()
print("nsqcli_healthy{command=\"to-file\"} 1.0" in body, "cramjam" in sys.modules, "snappy" in sys.modules)
import snappy
print(snappy.StreamDecompressor().decompress(snappy.StreamCompressor().compress(b"abc")) == b"abc")
srv.close()
"""


def test_serving_metrics_does_not_load_snappy_and_snappy_still_works():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False", "True"]
