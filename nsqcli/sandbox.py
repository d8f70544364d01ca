"""A local NSQ: real nsqlookupd + nsqd processes on 127.0.0.1 with free ports.

Used by the tests, the demo and ``nsqcli sandbox``::

    with Sandbox() as sb:
        sb.nsqd.tcp_address      # '127.0.0.1:40123'
        sb.lookupd.http_address  # '127.0.0.1:40125'
        extra = sb.add_nsqd(snappy=False)

Processes are started by us and stopped by us, by pid (SIGTERM, then SIGKILL after a grace
period). On Linux each child also gets PR_SET_PDEATHSIG so it dies with its parent even
when the parent is killed -9: no stray nsqd after a crashed test run.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SandboxError

INSTALL_HINT = ("run 'nsqcli sandbox --install' (builds NSQ v1.3.0 with Go), or scripts/install-nsq in a clone, "
                "or put nsqd and nsqlookupd on PATH")


def _search_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("NSQCLI_NSQ_BIN"):
        dirs.append(Path(os.environ["NSQCLI_NSQ_BIN"]))
    dirs.append(Path(__file__).resolve().parent.parent / ".nsq" / "bin")
    dirs.append(Path.cwd() / ".nsq" / "bin")
    from .nsq_install import user_dir

    dirs.append(user_dir() / "bin")  # `nsqcli sandbox --install`
    return dirs


def find_binary(name: str) -> str:
    """Path of an NSQ program: $NSQCLI_NSQ_BIN, the project's .nsq/bin, ./.nsq/bin, the user's
    `sandbox --install` directory, then PATH."""
    given = os.environ.get("NSQCLI_NSQ_BIN")
    if given:  # asked for: that one or an error, never silently another nsqd
        candidate = Path(given) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise SandboxError(f"{name} not found in NSQCLI_NSQ_BIN={given} (no executable {candidate}): set it to "
                           f"the directory that holds {name}, or unset it to use the one on PATH")
    for d in _search_dirs():
        candidate = d / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise SandboxError(f"{name} not found on PATH (nor in NSQCLI_NSQ_BIN, which is not set, nor in "
                       f"{_search_dirs()[-1]}): {INSTALL_HINT}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """(Linux, in a child) ``sig`` when the thread that forked this process ends
    (PR_SET_PDEATHSIG). False where that cannot be asked."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
    return True


def _die_with_parent() -> None:  # runs in the child between fork and exec
    die_with_parent(signal.SIGTERM)


def _ping(url: str, timeout: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


@dataclass
class Server:
    """One running nsqd or nsqlookupd process."""

    kind: str
    args: list[str]
    http_address: str
    tcp_address: str
    log_path: Path
    https_address: str | None = None
    data_path: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def http_url(self) -> str:
        return f"http://{self.http_address}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 15.0) -> "Server":
        if self.running:
            return self
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        finally:
            log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = self.http_url + "/ping"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SandboxError(f"{self.kind} exited with status {self.proc.returncode} at start-up: "
                                   f"{self.log_tail()}")
            if _ping(url):
                return
            time.sleep(0.02)
        self.stop()
        raise SandboxError(f"{self.kind} did not answer {url} within {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM by pid, SIGKILL after ``grace`` seconds."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL by pid: a crash, for fault tests."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, timeout: float = 15.0) -> "Server":
        """Stop (if running) and start again on the same ports and data path."""
        self.stop()
        return self._start_retrying(timeout)

    def _start_retrying(self, timeout: float) -> "Server":
        # The port was just released; a TIME_WAIT or racing bind can refuse it briefly.
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.start(timeout)
            except SandboxError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _start_on_free_ports(make, attempts: int = 5) -> Server:
    """Start the server ``make()`` builds; when a port it was given was taken between free_port()
    and the server's bind (another process on this machine got it), again on new ports."""
    for _ in range(attempts - 1):
        try:
            return make().start()
        except SandboxError as e:
            if "address already in use" not in str(e):
                raise
    return make().start()  # the last attempt: its error is the caller's


@dataclass
class NsqdOptions:
    """nsqd flags the tests and users need. None = nsqd's default."""

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_root_ca_file: str | None = None
    tls_client_auth_policy: str | None = None
    tls_required: bool = False
    snappy: bool = True
    deflate: bool = True
    max_deflate_level: int | None = None
    auth_http_address: str | None = None
    msg_timeout: str | None = None
    max_rdy_count: int | None = None
    max_msg_size: int | None = None
    max_body_size: int | None = None
    mem_queue_size: int | None = None
    max_heartbeat_interval: str | None = None
    extra_args: list[str] = field(default_factory=list)

    def to_args(self) -> list[str]:
        args = [f"--snappy={str(self.snappy).lower()}", f"--deflate={str(self.deflate).lower()}"]
        pairs = [("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key),
                 ("--tls-root-ca-file", self.tls_root_ca_file),
                 ("--tls-client-auth-policy", self.tls_client_auth_policy),
                 ("--max-deflate-level", self.max_deflate_level),
                 ("--auth-http-address", self.auth_http_address),
                 ("--msg-timeout", self.msg_timeout), ("--max-rdy-count", self.max_rdy_count),
                 ("--max-msg-size", self.max_msg_size), ("--max-body-size", self.max_body_size),
                 ("--mem-queue-size", self.mem_queue_size),
                 ("--max-heartbeat-interval", self.max_heartbeat_interval)]
        args += [f"{flag}={value}" for flag, value in pairs if value is not None]
        if self.tls_required:
            args.append("--tls-required=tcp-https")  # TCP must use TLS; plain HTTP stays for /ping
        return args + list(self.extra_args)


class Sandbox:
    """nsqlookupd + one or more nsqd, all on loopback, in a temporary directory."""

    def __init__(self, nsqd_options: NsqdOptions | None = None, with_lookupd: bool = True,
                 base_dir: str | None = None, host: str = "127.0.0.1"):
        self.host = host
        self.with_lookupd = with_lookupd
        self.nsqd_options = nsqd_options or NsqdOptions()
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="nsqcli-sandbox-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.lookupd: Server | None = None
        self.nsqds: list[Server] = []

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Sandbox":
        try:
            if self.with_lookupd:
                self.lookupd = _start_on_free_ports(self._make_lookupd)
            self.add_nsqd(self.nsqd_options)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in reversed(self.nsqds):
            server.stop()
        if self.lookupd:
            self.lookupd.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> "Sandbox":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- servers --------------------------------------------------------------------------
    @property
    def nsqd(self) -> Server:
        return self.nsqds[0]

    def _addr(self) -> str:
        return f"{self.host}:{free_port(self.host)}"

    def _make_lookupd(self) -> Server:
        tcp, http = self._addr(), self._addr()
        args = [find_binary("nsqlookupd"), f"--tcp-address={tcp}", f"--http-address={http}",
                f"--broadcast-address={self.host}"]
        return Server("nsqlookupd", args, http, tcp, self.base_dir / "nsqlookupd.log")

    def add_nsqd(self, options: NsqdOptions | None = None, start: bool = True) -> Server:
        """Start another nsqd (registered with the sandbox's nsqlookupd)."""
        options = options or self.nsqd_options
        n = len(self.nsqds)
        data = self.base_dir / f"nsqd{n}"
        data.mkdir(parents=True, exist_ok=True)

        def make() -> Server:
            tcp, http = self._addr(), self._addr()
            args = [find_binary("nsqd"), f"--tcp-address={tcp}", f"--http-address={http}",
                    f"--broadcast-address={self.host}", f"--data-path={data}", f"--node-id={n + 1}"]
            https = None
            if options.tls_cert:
                https = self._addr()
                args.append(f"--https-address={https}")
            else:
                args.append("--https-address=")
            if self.lookupd:
                args.append(f"--lookupd-tcp-address={self.lookupd.tcp_address}")
            return Server("nsqd", args + options.to_args(), http, tcp, self.base_dir / f"nsqd{n}.log",
                          https_address=https, data_path=data)

        server = _start_on_free_ports(make) if start else make()
        self.nsqds.append(server)
        return server

    def remove_nsqd(self, server: Server) -> None:
        server.stop()
        self.nsqds.remove(server)

    def env(self) -> dict[str, str]:
        """The NSQCLI_* variables that point nsqcli at this sandbox."""
        env = {"NSQCLI_NSQD_TCP_ADDRESS": " ".join(s.tcp_address for s in self.nsqds),
               "NSQCLI_NSQD_HTTP_ADDRESS": " ".join(s.http_address for s in self.nsqds)}
        if self.lookupd:
            env["NSQCLI_LOOKUPD_HTTP_ADDRESS"] = self.lookupd.http_address
        return env
