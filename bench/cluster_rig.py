"""The rig of bench.cluster: the NSQ servers (2 nsqlookupd + N nsqd on free loopback ports, each
nsqd registered with both), kept-alive HTTP to them, and the tools under test as processes -
started in a process group of their own that dies with the bench (PR_SET_PDEATHSIG), optionally
under a lower soft RLIMIT_NOFILE, and watched from /proc while they run (peak threads, fds and
RSS of the whole process tree)."""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import resource
import signal
import subprocess
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

from nsqcli.errors import SandboxError
from nsqcli.sandbox import Server, find_binary, free_port

TICK = 0.1  # seconds between samples
try:  # loaded here, not between fork and exec (a dlopen there could wait on a lock another thread held)
    PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except OSError:
    PRCTL = None
CLASSIFY_EVERY = 1.0  # seconds between two readlink passes over every fd (they cost CPU),
CLASSIFY_GROWTH = 1.1  # unless the fd count grew by this factor since the last one


# -- HTTP: one kept-alive connection per server ------------------------------------------------

class Http:
    """A kept-alive HTTP/1.1 connection to one nsqd or nsqlookupd, used by one thread at a time."""

    def __init__(self, address: str, timeout: float = 5.0):
        self.address, self.timeout, self.conn = address, timeout, None

    def request(self, method: str, path: str, params: dict | None = None, data: bytes | None = None) -> bytes:
        url = path + ("?" + urllib.parse.urlencode(params) if params else "")
        for attempt in (1, 2):  # a kept-alive connection the server closed: once more, fresh
            try:
                if self.conn is None:
                    host, port = self.address.rsplit(":", 1)
                    self.conn = http.client.HTTPConnection(host, int(port), timeout=self.timeout)
                self.conn.request(method, url, body=data)
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        if resp.status != 200:
            raise RuntimeError(f"{self.address}{url}: HTTP {resp.status} {raw[:200]!r}")
        return raw

    def json(self, path: str, **params) -> dict:
        return json.loads(self.request("GET", path, params))

    def post(self, path: str, data: bytes | None = None, **params) -> None:
        self.request("POST", path, params, data)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


# -- the cluster -------------------------------------------------------------------------------

def new_server(kind: str, base: Path, name: str, *extra: str, node_id: int = 0) -> Server:
    tcp, http_ = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    args = [find_binary(kind), f"--tcp-address={tcp}", f"--http-address={http_}", "--broadcast-address=127.0.0.1"]
    if kind == "nsqd":
        (base / name).mkdir(exist_ok=True)
        args += [f"--data-path={base / name}", "--https-address=", f"--node-id={node_id}"]
    return Server(kind, args + list(extra), http_, tcp, base / f"{name}.log", data_path=base / name)


def start_server(kind: str, base: Path, name: str, *extra: str, node_id: int = 0) -> Server:
    """Start a server on free ports; when a port was taken between finding it and binding it
    (by another server's client sockets, or another program), again on new ports."""
    for attempt in range(5):
        server = new_server(kind, base, name, *extra, node_id=node_id)
        try:
            return server.start()
        except SandboxError:
            if attempt == 4 or "address already in use" not in server.log_tail(20):
                raise
            server.log_path.unlink(missing_ok=True)
    raise AssertionError("unreachable")


class Cluster:
    """2 nsqlookupd + N nsqd in ``base``; every nsqd registered with both lookupds."""

    def __init__(self, nodes: int, base: Path):
        self.base, self.size = base, nodes
        self.lookupds: list[Server] = []
        self.nsqds: list[Server] = []
        self.http: list[Http] = []
        self.pool = ThreadPoolExecutor(max_workers=min(nodes, 16), thread_name_prefix="bench-http")

    def start(self) -> Cluster:
        """Start the servers one by one (each listed as soon as it runs, for stop())."""
        for i in range(2):
            self.lookupds.append(start_server("nsqlookupd", self.base, f"lookupd{i}"))
        flags = [f"--lookupd-tcp-address={lk.tcp_address}" for lk in self.lookupds]
        for i in range(self.size):
            self.nsqds.append(start_server("nsqd", self.base, f"nsqd{i}", *flags, node_id=i + 1))
        self.http = [Http(s.http_address) for s in self.nsqds]
        return self

    def stop(self) -> None:
        """Resume anything stopped, then SIGTERM every server (all at once), SIGKILL after 10 s."""
        for s in self.nsqds:
            if s.running:
                os.kill(s.pid, signal.SIGCONT)
        for s in self.nsqds + self.lookupds:
            if s.running:
                s.proc.send_signal(signal.SIGTERM)
        for s in self.nsqds + self.lookupds:
            s.stop(grace=10.0)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for h in self.http:
            h.close()

    def lookupd_addresses(self) -> list[str]:
        return [lk.http_address for lk in self.lookupds]

    def each_node(self, fn, nodes=None) -> list:
        """fn(node index, Http) on every node at once (each node's connection used by one call)."""
        nodes = range(len(self.nsqds)) if nodes is None else nodes
        return list(self.pool.map(lambda n: fn(n, self.http[n]), nodes))

    def channel_totals(self, channel: str) -> dict[str, int]:
        """Sum over every node of the channel's clients, pending messages and message_count."""
        def one(_, h: Http) -> dict[str, int]:
            stats = h.json("/stats", format="json", channel=channel, include_clients="false")
            chans = [c for t in stats.get("topics") or [] for c in t.get("channels") or []]
            return {"clients": sum(c["client_count"] for c in chans),
                    "pending": sum(c["depth"] + c["in_flight_count"] + c["deferred_count"] for c in chans),
                    "messages": sum(c["message_count"] for c in chans)}
        per_node = self.each_node(one)
        return {k: sum(d[k] for d in per_node) for k in ("clients", "pending", "messages")}


# -- the tools' processes -------------------------------------------------------------------------

def proc_status(pid: int, key: str) -> int:
    """A /proc/PID/status number (kB for memory), 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def child_setup(nofile: int | None):
    """preexec_fn: die with this process (PR_SET_PDEATHSIG SIGKILL); optionally a soft fd limit
    (the hard one left as it is, as ``ulimit -Sn`` does)."""
    def setup() -> None:
        if PRCTL is not None:
            PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if nofile is not None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    return setup


def descendants(root: int) -> list[int]:
    """root and every process below it (one scan of /proc)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                parent[int(d)] = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = [root], [root]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        tree += frontier
    return tree


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def fd_kinds(pid: int) -> tuple[int, int]:
    """(fds, fds that are sockets, pipes or anon inodes - not files) of one process."""
    total = other = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0, 0
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        total += 1
        other += target.startswith(("socket:", "pipe:", "anon_inode:"))
    return total, other


class Sampler:
    """Peaks of a process tree, sampled every TICK by a thread: threads (``Threads:``), fds, RSS
    in MB (sum of VmRSS, or the root's VmHWM if higher) and ``conn_fds``: the fds that are not
    files, counted by readlink when the fd count passes the last count classified, and then
    only once per CLASSIFY_EVERY or after CLASSIFY_GROWTH (8,000 readlinks every 100 ms would
    take the tool's CPU)."""

    def __init__(self, pid: int):
        self.pid, self.tree = pid, [pid]
        self.peak = {"threads": 0, "fds": 0, "conn_fds": 0, "rss_mb": 0.0, "samples": 0}
        self._classified, self._classified_at = 0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return dict(self.peak)

    def _run(self) -> None:
        i = 0
        while True:
            if i % 5 == 0:
                self.tree = descendants(self.pid)
            self._sample()
            i += 1
            if self._stop.wait(TICK):
                return

    def _sample(self) -> None:
        p = self.peak
        threads = sum(proc_status(q, "Threads") for q in self.tree)
        p["samples"] += threads > 0  # the process was there
        p["threads"] = max(p["threads"], threads)
        rss = sum(proc_status(q, "VmRSS") for q in self.tree)
        p["rss_mb"] = max(p["rss_mb"], rss / 1024, proc_status(self.pid, "VmHWM") / 1024)
        fds = sum(fd_count(q) for q in self.tree)
        p["fds"] = max(p["fds"], fds)
        now = time.monotonic()
        due = now - self._classified_at >= CLASSIFY_EVERY or fds >= self._classified * CLASSIFY_GROWTH
        if fds > self._classified and due:
            self._classified, self._classified_at = fds, now
            p["conn_fds"] = max(p["conn_fds"], sum(fd_kinds(q)[1] for q in self.tree))


class Child:
    """A tool under test: its own process group, dies with us, stderr to a file, sampled from
    its start; on leaving the ``with`` block a child still running has its group SIGKILLed."""

    def __init__(self, cmd: list[str], err_path: Path, stdout=subprocess.DEVNULL, nofile: int | None = None):
        self.cmd, self.err_path, self.stdout, self.nofile = cmd, err_path, stdout, nofile

    def __enter__(self) -> Self:
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self.stdout, stderr=err,
                                         start_new_session=True,
                                         preexec_fn=child_setup(self.nofile))  # noqa: PLW1509 - two syscalls
        self.t0 = time.monotonic()
        self.cpu0 = time.process_time()
        self.sampler = Sampler(self.proc.pid).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.peaks = self.sampler.stop()
        self.peaks["bench_cpu"] = (time.process_time() - self.cpu0) / max(self.elapsed(), 1e-9)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_tick(self, t_start: float) -> None:
        """Until TICK after ``t_start`` (monotonic), or the child's exit if sooner."""
        try:
            self.proc.wait(max(0.0, TICK - (time.monotonic() - t_start)))
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def terminate(self, grace: float = 30.0) -> int | str:
        """SIGTERM, wait ``grace`` s, then SIGKILL; the exit code (negative: a signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
                return "killed after SIGTERM"
        return self.proc.returncode

    def stderr_tail(self) -> str:
        lines = self.err_path.read_text(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else ""
