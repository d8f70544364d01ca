"""The sandbox starts real servers and leaves no process behind."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from helpers import http_get_json, http_post, topic_stats, wait_for
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
    with pytest.raises(SandboxError, match=r"nsq\w+ not found \(looked in .* and on PATH\): run 'nsqcli sandbox "
                                           r"--install' .*scripts/install-nsq"):
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
