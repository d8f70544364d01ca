"""A real toxiproxy-server between nsqcli and a real nsqd, for the fault suite.

toxiproxy is built from its Go module by scripts/install-toxiproxy into .nsq/bin (``make
setup`` does it). The server is started by us on a free loopback port and stopped by us, by
pid; proxies and toxics are made through its HTTP API with plain urllib/json::

    with Toxiproxy.start(tmp_dir) as tp:
        p = tp.proxy(nsqd.tcp_address)            # listens on 127.0.0.1:<free port>
        p.add("latency", latency=3000)            # downstream unless stream="upstream"
        ... nsqcli --nsqd-tcp-address p.listen ...
        p.remove_all()                            # or: with p.toxic(...):
        p.delete()

Toxics (v2.5.0): latency{latency,jitter ms}, bandwidth{rate KB/s}, slow_close{delay ms},
timeout{timeout ms; 0 = data stops, connection stays open until the toxic is removed},
reset_peer{timeout ms, then RST}, slicer{average_size, size_variation bytes, delay us},
limit_data{bytes: the connection is closed once that many have passed}.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from nsqcli.sandbox import _die_with_parent, free_port

ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run scripts/install-toxiproxy (make setup does it): it builds toxiproxy-server v2.5.0 with Go"
_names = itertools.count()


class ToxiproxyError(Exception):
    pass


def find_server() -> str:
    candidate = ROOT / ".nsq" / "bin" / "toxiproxy-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("toxiproxy-server")
    if found:
        return found
    raise ToxiproxyError(f"toxiproxy-server not found in {candidate.parent} or on PATH: {INSTALL_HINT}")


class Toxiproxy:
    def __init__(self, proc: subprocess.Popen, address: str, log: Path):
        self.proc, self.address, self.log = proc, address, log
        self.proxies: list[Proxy] = []

    @classmethod
    def start(cls, workdir: Path, timeout: float = 10.0) -> "Toxiproxy":
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = workdir / "toxiproxy.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([find_server(), "-host", "127.0.0.1", "-port", str(port)],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=dict(os.environ, LOG_LEVEL="info"), preexec_fn=_die_with_parent)
        tp = cls(proc, f"127.0.0.1:{port}", log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ToxiproxyError(f"toxiproxy-server exited {proc.returncode}: {log.read_text()[-500:]}")
            try:
                tp.request("GET", "/version")
                return tp
            except OSError:
                time.sleep(0.05)
        tp.stop()
        raise ToxiproxyError(f"toxiproxy-server did not answer on {tp.address} within {timeout}s")

    def request(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise ToxiproxyError(f"{method} {path}: HTTP {e.code} {e.read()[:300]!r}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode(errors="replace")

    def proxy(self, upstream: str, name: str | None = None) -> "Proxy":
        """A new proxy to ``upstream`` (host:port) on a free loopback port."""
        name = name or f"p{next(_names)}"
        info = self.request("POST", "/proxies", {"name": name, "listen": "127.0.0.1:0",
                                                   "upstream": upstream, "enabled": True})
        p = Proxy(self, name, info["listen"], upstream)
        self.proxies.append(p)
        return p

    def stop(self) -> None:
        for p in list(self.proxies):
            with contextlib.suppress(OSError, ToxiproxyError):
                p.delete()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> "Toxiproxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Proxy:
    def __init__(self, server: Toxiproxy, name: str, listen: str, upstream: str):
        self.server, self.name, self.listen, self.upstream = server, name, listen, upstream
        self.toxics: list[str] = []

    def add(self, kind: str, stream: str = "downstream", toxicity: float = 1.0, **attributes) -> str:
        """Add a toxic; returns its name. ``stream``: downstream (nsqd -> client) or upstream."""
        name = f"{kind}_{stream}_{next(_names)}"
        self.server.request("POST", f"/proxies/{self.name}/toxics", {
            "name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes})
        self.toxics.append(name)
        return name

    def remove(self, name: str) -> None:
        self.server.request("DELETE", f"/proxies/{self.name}/toxics/{name}")
        self.toxics.remove(name)

    def remove_all(self) -> None:
        for name in list(self.toxics):
            self.remove(name)

    @contextlib.contextmanager
    def toxic(self, kind: str, stream: str = "downstream", **attributes):
        name = self.add(kind, stream, **attributes)
        try:
            yield name
        finally:
            self.remove(name)

    def set_enabled(self, enabled: bool) -> None:
        """Disabled: listening stops and every open connection through it is closed."""
        self.server.request("POST", f"/proxies/{self.name}", {"enabled": enabled})

    def delete(self) -> None:
        self.server.request("DELETE", f"/proxies/{self.name}")
        self.server.proxies.remove(self)
