"""sd_notify: what a fake systemd (a datagram socket the test binds, as NOTIFY_SOCKET) receives,
the watchdog interval systemd's rules give, and that no failure of the socket reaches the daemon."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from nsqcli.daemon.sdnotify import Notifier


@pytest.fixture
def systemd(tmp_path):
    """A bound AF_UNIX datagram socket in a tmp dir: (its path, the socket)."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield path, sock
    sock.close()


def received(sock) -> list[bytes]:
    """Every datagram waiting on ``sock``."""
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(4096))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(2)
    return out


def test_no_notify_socket_no_notifier():
    assert Notifier.from_env({}) is None
    assert Notifier.from_env({"NOTIFY_SOCKET": ""}) is None
    assert Notifier.from_env({"WATCHDOG_USEC": "30000000"}) is None


def test_a_path_socket_receives_exactly_the_datagrams(systemd):
    path, sock = systemd
    env = {"NOTIFY_SOCKET": path}
    n = Notifier.from_env(env)
    assert n.ready("archiving 2 topics")
    assert n.status("1,204 msg/s\nlag 12")  # a newline would start another field: one line
    assert n.watchdog()
    assert n.reloading("SIGHUP: files closed")
    assert n.extend_timeout(1.5)
    assert n.stopping("draining 3 in flight")
    got = [sock.recv(4096) for _ in range(6)]
    assert got[0] == f"READY=1\nSTATUS=archiving 2 topics\nMAINPID={os.getpid()}".encode()
    assert got[1] == b"STATUS=1,204 msg/s lag 12"
    assert got[2] == b"WATCHDOG=1"
    reload, usec, status = got[3].split(b"\n")
    assert reload == b"RELOADING=1" and status == b"STATUS=SIGHUP: files closed"
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert usec.startswith(b"MONOTONIC_USEC=") and 0 <= now - int(usec.split(b"=")[1]) < 5_000_000
    assert got[4] == b"EXTEND_TIMEOUT_USEC=1500000"
    assert got[5] == b"STOPPING=1\nSTATUS=draining 3 in flight"
    assert received(sock) == []  # nothing more
    assert (n.sent, n.errors, n.last_error) == (6, 0, "")
    assert env == {"NOTIFY_SOCKET": path}  # left for to-file's hand-off exec()
    n.close()


def test_an_abstract_socket_receives_them(systemd):
    name = f"nsqcli-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert n.ready() and n.watchdog() and n.stopping()
        assert [sock.recv(4096) for _ in range(3)] == [f"READY=1\nMAINPID={os.getpid()}".encode(),
                                                       b"WATCHDOG=1", b"STOPPING=1"]
        assert n.errors == 0
    finally:
        sock.close()


def test_unset_removes_the_variables_when_asked(systemd):
    env = {"NOTIFY_SOCKET": systemd[0], "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1", "HOME": "/h"}
    n = Notifier.from_env(env, unset=True)
    assert env == {"HOME": "/h"} and n.address == systemd[0]
    assert n.watchdog_interval() is None  # WATCHDOG_PID was another process's


@pytest.mark.parametrize("usec,pid,want", [
    ("30000000", None, 15.0),            # WatchdogSec=30: ping every 15 s
    ("30000000", "self", 15.0),
    ("30000000", "other", None),         # systemd's rule: the watchdog is another process's
    ("30000000", "junk", None),
    ("500000", "", 0.25),                # an empty WATCHDOG_PID is unset
    (None, None, None), ("0", None, None), ("-5", None, None), ("30s", None, None),
])
def test_watchdog_interval_follows_systemds_rules(usec, pid, want):
    env = {"NOTIFY_SOCKET": "/run/x"}
    if usec is not None:
        env["WATCHDOG_USEC"] = usec
    if pid is not None:
        env["WATCHDOG_PID"] = {"self": str(os.getpid()), "other": str(os.getpid() + 1)}.get(pid, pid)
    assert Notifier.from_env(env).watchdog_interval() == want


def test_a_socket_nobody_listens_on_never_raises_and_a_systemd_that_comes_back_is_reached(tmp_path):
    path = str(tmp_path / "gone.sock")
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert n.ready("x") is False and n.watchdog() is False and n.stopping() is False
    assert n.errors == 3 and n.sent == 0 and path in n.last_error and "\n" not in n.last_error
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # systemd back (daemon-reexec): a new socket
    sock.bind(path)
    sock.settimeout(2)
    try:
        assert n.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
        sock.close()
        os.unlink(path)  # it goes away again while connected
        assert n.status("still here") is False and n.errors == 4
    finally:
        sock.close()


def test_unsupported_addresses_are_errors_not_exceptions():
    for address in ("vsock:2:1234", "relative/path.sock"):
        n = Notifier.from_env({"NOTIFY_SOCKET": address})
        assert n.ready() is False and "not a socket path" in n.last_error and address in n.last_error


def test_a_full_queue_does_not_hold_the_caller(systemd):
    """A systemd that does not read: each send waits at most SEND_WAIT once, then not at all
    until one gets through; the datagrams that fit are there, and sending resumes after."""
    path, sock = systemd
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    t0 = time.monotonic()
    results = [n.watchdog() for _ in range(200)]
    took = time.monotonic() - t0
    assert took < 2.0, took  # a blocking send would never return; a waiting one would take 200 x 0.25 s
    assert results[0] and not all(results) and n.errors == results.count(False)
    assert "queue" in n.last_error
    assert len(received(sock)) == results.count(True)
    assert n.status("room again") and sock.recv(4096) == b"STATUS=room again"


def test_the_readme_unit_is_valid_and_names_real_options(tmp_path):
    """README's sample unit: systemd-analyze verify has nothing to say about it (where systemd is
    installed), and every option its ExecStart gives is one `nsqcli to-file --help` lists."""
    import re
    import shlex
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.helpers import run_nsqcli

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    m = re.search(r"<!-- systemd-unit -->\n```ini\n(.*?)```\n<!-- /systemd-unit -->", readme, re.S)
    assert m, "README.md lost its systemd unit"
    unit = m.group(1)
    for needed in ("Type=notify", "NotifyAccess=main", "WatchdogSec=", "ExecReload=/bin/kill -HUP $MAINPID",
                   "Restart=on-failure", "RestartSec=", "StartLimitIntervalSec=", "StartLimitBurst=",
                   "KillSignal=SIGTERM", "TimeoutStopSec="):
        assert needed in unit
    exec_start = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.S | re.M).group(1).replace("\\\n", " ")
    argv = shlex.split(exec_start)
    assert argv[:2] == ["/usr/local/bin/nsqcli", "to-file"]
    r = run_nsqcli(["to-file", "--help"])
    assert r.returncode == 0
    options = set(re.findall(r"(--[a-z][a-z-]+)", r.stdout.decode()))
    given = [a for a in argv if a.startswith("--")]
    assert "--metrics-address" in given and not set(given) - options, set(given) - options
    if shutil.which("systemd-analyze"):
        path = tmp_path / "nsqcli-archive.service"
        path.write_text(unit.replace("/usr/local/bin/nsqcli", str(Path(sys.executable).parent / "nsqcli")))
        v = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True,
                           timeout=60)
        said = [ln for ln in (v.stdout + v.stderr).splitlines() if str(path) in ln or "nsqcli-archive" in ln]
        assert v.returncode == 0 and not said, v.stdout + v.stderr
