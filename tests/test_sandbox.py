"""The sandbox starts real servers and leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.helpers import NSQCLI, clean_env, http_get_json, http_post, one_error_line, run_nsqcli, topic_stats, wait_for
from tests.support.inprocess import run_in_process

from nsqcli import sandbox as sbmod
from nsqcli.errors import SandboxError
from nsqcli.sandbox import Sandbox


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_session_servers_answer(sandbox, nsqd, lookupd):
    assert http_get_json(nsqd.http_address, "/info")["version"] == "1.3.0"
    assert http_get_json(lookupd.http_address, "/info")["version"] == "1.3.0"
    assert nsqd.tcp_address.startswith("127.0.0.1:")
    env = sandbox.env()
    assert env["NSQCLI_NSQD_TCP_ADDRESS"] == nsqd.tcp_address
    assert env["NSQCLI_LOOKUPD_HTTP_ADDRESS"] == lookupd.http_address


def test_nsqd_registers_with_lookupd(nsqd, lookupd, topic):
    http_post(nsqd.http_address, "/pub", b"hi", topic=topic)
    assert topic_stats(nsqd, topic)["message_count"] == 1
    wait_for(lambda: topic in http_get_json(lookupd.http_address, "/topics")["topics"],
             what=f"{topic} registered in nsqlookupd")
    producers = http_get_json(lookupd.http_address, "/lookup", topic=topic)["producers"]
    assert [f"{p['broadcast_address']}:{p['tcp_port']}" for p in producers] == [nsqd.tcp_address]


def test_stop_leaves_no_process(tmp_path):
    sb = Sandbox(base_dir=str(tmp_path))
    sb.start()
    extra = sb.add_nsqd()
    pids = [sb.lookupd.pid, sb.nsqd.pid, extra.pid]
    assert all(pid_alive(p) for p in pids)
    sb.stop()
    assert not any(pid_alive(p) for p in pids)


def test_kill_and_restart_keeps_address_and_data(tmp_path):
    with Sandbox(with_lookupd=False, base_dir=str(tmp_path)) as sb:
        http_post(sb.nsqd.http_address, "/pub", b"persist", topic="keep")
        http_post(sb.nsqd.http_address, "/channel/create", topic="keep", channel="c")
        old_pid, addr = sb.nsqd.pid, sb.nsqd.tcp_address
        sb.nsqd.stop()  # clean stop flushes the memory queue to disk
        assert not pid_alive(old_pid)
        sb.nsqd.restart()
        assert sb.nsqd.tcp_address == addr and sb.nsqd.pid != old_pid
        assert topic_stats(sb.nsqd, "keep")["channels"][0]["depth"] == 1


def test_missing_binary_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(sbmod, "_search_dirs", lambda: [tmp_path])
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NSQCLI_NSQ_BIN", raising=False)
    with pytest.raises(SandboxError, match=r"nsq\w+ not found on PATH \(nor in NSQCLI_NSQ_BIN, which is not set, nor "
                                           r"in .*\): run 'nsqcli sandbox --install' .*scripts/install-nsq"):
        Sandbox().start()


def test_cli_sandbox_runs_until_ctrl_c(tmp_path):
    env_file = tmp_path / "nsq.env"
    proc = subprocess.Popen([sys.executable, "-m", "nsqcli", "sandbox", "--nodes", "2",
                             "--env-file", str(env_file), "--data-dir", str(tmp_path / "d")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: proc.poll() is not None or (
                 env_file.exists() and env_file.read_text().count("export") == 3),
                 timeout=20, what="sandbox env file")
        assert proc.poll() is None, proc.communicate()
        env = dict(shlex.split(line)[1].split("=", 1) for line in env_file.read_text().splitlines())
        https, tcps = env["NSQCLI_NSQD_HTTP_ADDRESS"].split(), env["NSQCLI_NSQD_TCP_ADDRESS"].split()
        assert len(https) == len(tcps) == 2  # every node, so that stat/tail/pub see the whole cluster
        for http, tcp in zip(https, tcps):
            assert http_get_json(http, "/info")["tcp_port"] == int(tcp.rsplit(":", 1)[1])
        time.sleep(0.2)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        child_pids = [int(p) for p in children.stdout.split()]
        assert len(child_pids) == 3  # nsqlookupd + 2 nsqd
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.splitlines()[0].startswith("export NSQCLI_NSQD_TCP_ADDRESS='127.0.0.1:")
    assert "sandbox stopped" in err
    assert not any(pid_alive(p) for p in child_pids)


ROOT = Path(__file__).resolve().parent.parent




def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def pip_like_env(tmp_path, **extra) -> dict:
    """nsqcli as pip installs it: the package alone (no clone's .nsq/bin next to it)."""
    import shutil

    site = tmp_path / "site"
    if not site.exists():
        shutil.copytree(ROOT / "nsqcli", site / "nsqcli", ignore=shutil.ignore_patterns("__pycache__"))
    return clean_env({"PATH": "/usr/bin:/bin", "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path),
                      "PYTHONPATH": str(site), **extra})


# -- sandbox ---------------------------------------------------------------------------------------
def test_documented_detached_sandbox_line_works_in_a_shell(tmp_path):
    """`eval "$(nsqcli sandbox --detach)"` returns (no hang), points the shell at a real NSQ,
    saves a context, and `kill $NSQCLI_SANDBOX_PID` stops every process."""
    bindir = Path(NSQCLI[0]).parent
    cfg = tmp_path / "cfg"
    script = f"""
set -e
nsqcli() {{ "{NSQCLI[0]}" -m nsqcli "$@"; }}
eval "$(nsqcli sandbox --detach --nodes 2 --save-context box)"
echo "pid=$NSQCLI_SANDBOX_PID"
echo "nsqd=$NSQCLI_NSQD_TCP_ADDRESS"
nsqcli pub tour 'hello' --json
nsqcli tail tour -c first -n 1
nsqcli stat -n 1 --no-live -t tour --per-node | wc -l | sed 's/^/statlines=/'
kill $NSQCLI_SANDBOX_PID
"""
    t0 = time.monotonic()
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                       env=clean_env({"NSQCLI_CONFIG_DIR": str(cfg), "PATH": f"{bindir}:{os.environ['PATH']}"}))
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    out = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if re.match(r"^(pid|nsqd|statlines)=", ln))
    lines = r.stdout.splitlines()
    assert json.loads(lines[2])["published"] == 1 and lines[3] == "hello"
    assert len(out["nsqd"].split()) == 2
    assert int(out["statlines"]) == 2 + 2  # header + a row per node: the whole cluster
    saved = json.loads(run_nsqcli(["context", "show", "box", "--json"], {"NSQCLI_CONFIG_DIR": str(cfg)}).stdout)
    assert saved["nsqd-tcp-address"] == out["nsqd"].split()
    pid = int(out["pid"])
    wait_for(lambda: not _alive(pid), timeout=15, what="sandbox stopped")
    ports = [a.rsplit(":", 1)[1] for a in saved["nsqd-tcp-address"]]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not any(f":{p}" in ps for p in ports), "an nsqd of the detached sandbox is still running"


def test_sandbox_without_nsqd_says_what_to_do(tmp_path):
    """A pip install without nsqd and without Go."""
    env = pip_like_env(tmp_path)
    for args in (["sandbox"], ["sandbox", "--detach"]):
        r = subprocess.run(NSQCLI + args, capture_output=True, timeout=30, env=env, cwd=tmp_path)
        one_error_line(r, 1, r"nsq(lookup)?d not found on PATH \(nor in NSQCLI_NSQ_BIN, which is not set, nor in .*\): "
                             r"run 'nsqcli sandbox --install'")
    r = subprocess.run(NSQCLI + ["sandbox", "--install"], capture_output=True, timeout=30, env=env, cwd=tmp_path)
    one_error_line(r, 1, r"'go' not found on PATH\. Install Go")


def test_sandbox_install_builds_into_the_user_data_dir(tmp_path):
    """`nsqcli sandbox --install` with Go present: the same build as scripts/install-nsq (its Go
    module and build caches are Go's own, which scripts/install-nsq filled, so the build is quick)."""
    import shutil

    from nsqcli import nsq_install

    data = tmp_path / "data"
    bindir = data / "nsqcli" / f"nsq-{nsq_install.NSQ_VERSION}" / "bin"
    # sandbox --install keeps Go caches of its own beside the programs: here they are Go's own,
    # where scripts/install-nsq downloaded the module and built it
    go = Path(shutil.which("go")).parent
    (data / "nsqcli" / "go").mkdir(parents=True)
    for name, var in (("mod", "GOMODCACHE"), ("cache", "GOCACHE")):
        where = subprocess.run([go / "go", "env", var], capture_output=True, text=True, check=True).stdout.strip()
        os.symlink(where, data / "nsqcli" / "go" / name)
    env = pip_like_env(tmp_path, PATH=f"{go}:/usr/bin:/bin")
    r = subprocess.run(NSQCLI + ["sandbox", "--install"], capture_output=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert f"installed into {bindir}" in r.stderr.decode()
    assert subprocess.run([bindir / "nsqd", "--version"], capture_output=True, text=True).stdout.startswith("nsqd v1.3.0")
    r = subprocess.run(NSQCLI + ["version", "--json"], capture_output=True, timeout=30, cwd=tmp_path, env=env)
    assert json.loads(r.stdout)["nsqd"] == f"v1.3.0 ({bindir}/nsqd)"
    # and the sandbox runs from there
    r = subprocess.run(["bash", "-c", f"eval \"$('{NSQCLI[0]}' -m nsqcli sandbox --detach)\"; "
                        f"'{NSQCLI[0]}' -m nsqcli pub x y && kill $NSQCLI_SANDBOX_PID"],
                       capture_output=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_set_e_idiom_stops_the_script_when_the_sandbox_cannot_start(tmp_path):
    """The README's idiom for scripts: --env-file then source. `eval "$(...)"` would eval an empty
    string (status 0) and run on against 127.0.0.1:4150; this stops at the failing line."""
    script = f"""
set -e
nsqcli() {{ "{NSQCLI[0]}" -m nsqcli "$@"; }}
nsqcli sandbox --detach --env-file {tmp_path}/nsq.env > /dev/null
. {tmp_path}/nsq.env
echo reached
"""
    bad = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env=clean_env({"NSQCLI_NSQ_BIN": str(tmp_path / "no-such-dir")}))
    assert bad.returncode == 1 and "reached" not in bad.stdout, bad
    assert bad.stderr.splitlines() == [f"nsqcli: error: nsqd not found in NSQCLI_NSQ_BIN={tmp_path / 'no-such-dir'} "
                                       f"(no executable {tmp_path / 'no-such-dir' / 'nsqd'}): set it to the directory "
                                       "that holds nsqd, or unset it to use the one on PATH"], bad.stderr
    good = subprocess.run(["bash", "-c", script + 'nsqcli pub t x --json > /dev/null\nkill "$NSQCLI_SANDBOX_PID"\n'
                           'echo "pid=$NSQCLI_SANDBOX_PID"'], capture_output=True, text=True, timeout=60, env=clean_env())
    assert good.returncode == 0 and "reached" in good.stdout, good.stderr
    pid = int(good.stdout.split("pid=")[1])
    wait_for(lambda: not _alive(pid), timeout=15, what="sandbox stopped")
    import glob
    import tempfile

    def ours(path: str) -> bool:  # (another test's sandbox may remove its log between glob and open)
        try:
            with open(path, errors="replace") as f:
                return f"pid {pid}," in f.read()
        except FileNotFoundError:
            return False

    leftovers = [p for p in glob.glob(os.path.join(tempfile.gettempdir(), "nsqcli-sandbox-*.log")) if ours(p)]
    assert leftovers == []  # its log went with it


def test_sandbox_msg_timeout_takes_a_duration_or_bare_seconds(tmp_path):
    r = subprocess.run(NSQCLI + ["sandbox", "--detach", "--json", "--no-lookupd", "--msg-timeout", "1"],
                       capture_output=True, timeout=60, env=clean_env())
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    try:
        http = doc["env"]["NSQCLI_NSQD_HTTP_ADDRESS"]
        import urllib.request

        with urllib.request.urlopen(f"http://{http}/config/msg_timeout", timeout=5) as answer:
            assert json.loads(answer.read()) == 1_000_000_000  # ns: 1 s
    finally:
        os.kill(doc["pid"], 15)
    one_error_line(run_in_process(["sandbox", "--msg-timeout", "soon"]), 2, r"'soon' is not a duration")


# -- refusals: bad input (one line, exit 2, nothing started) ---------------------------------------------
from tests.support.refusals import FILE, bad_input, ids  # noqa: E402

BAD_INPUT = [
    (["sandbox", "--nodes", "0"], 2, r"'--nodes': 0 is not in the range 1<=x<=16"),
    (["sandbox", "--tls-cert", FILE], 2, r"--tls-cert and --tls-key go together"),
    (["sandbox", "--save-context", "bad name!"], 2, r"context name 'bad name!' must be 1-64 letters"),
    (["sandbox", "--install", "--detach"], 2, r"--install builds NSQ and exits: it takes no other option"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


# -- --json is one line -----------------------------------------------------------------------------------

def test_sandbox_json_is_one_line_and_points_at_running_servers(tmp_path):
    p = subprocess.Popen(NSQCLI + ["sandbox", "--json", "--data-dir", str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=clean_env({k: v for k, v in os.environ.items()
                                                                if k == "NSQCLI_NSQ_BIN"}))
    try:
        line = p.stdout.readline()
        doc = json.loads(line)
        r = run_nsqcli(["pub", "x", "y", "--nsqd-tcp-address", doc["nsqd"][0]["tcp_address"]])
        assert r.returncode == 0, r.stderr
        assert doc["env"]["NSQCLI_NSQD_TCP_ADDRESS"] == doc["nsqd"][0]["tcp_address"]
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and rest == b""


def test_a_port_taken_before_the_server_binds_it_is_replaced(monkeypatch, tmp_path):
    """free_port() gives a port that is free at that moment; another process on the machine (a
    parallel test run) can bind it before nsqd does. nsqd then exits at start-up ("address already
    in use"), and retrying that port for 15 s failed the test: it starts on new ports instead."""
    import socket

    from nsqcli import sandbox

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    given = iter([taken])
    real = sandbox.free_port
    monkeypatch.setattr(sandbox, "free_port", lambda host="127.0.0.1": next(given, None) or real(host))
    sb = sandbox.Sandbox(with_lookupd=False, base_dir=str(tmp_path / "sb"))
    try:
        sb.start()
        assert sb.nsqd.running and sb.nsqd.tcp_address != f"127.0.0.1:{taken}"
        assert "address already in use" in sb.nsqd.log_path.read_text()  # the first try met the taken port
    finally:
        sb.stop()
        held.close()
