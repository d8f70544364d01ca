"""`nsqcli to-file` hands itself off to a fresh image without click (nsqcli.cli.handoff): same
pid, same command line, same behaviour, signals at any moment of the exec still exit cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.helpers import NSQCLI, clean_env, one_error_line, wait_for
from tests.cli.test_to_file import STEADY_NAME, StderrLog, drained, numbered, publish, read_records, start, stop

from nsqcli.cli import archiving
from nsqcli.client.config import Config, TLSConfig


def environ_of(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)


def test_to_file_continues_in_the_same_process_with_the_same_command_line(nsqd, topic, tmp_path):
    out = tmp_path / "out"
    args = ["-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(out), "--gzip",
            "--sync-interval", "0.2s", "--json", *STEADY_NAME]  # files_closed == 1: no hour may turn
    p = start(args)
    log = StderrLog(p)
    try:
        wait_for(lambda: b"archiving topic" in log.text, what="subscribed")
        # the image was replaced (exec): its initial environment names the pipe the spec came through
        assert "NSQCLI_HANDOFF" in environ_of(p.pid)
        assert open(f"/proc/{p.pid}/cmdline", "rb").read().split(b"\0")[:-1] == \
            [a.encode() for a in NSQCLI + ["to-file", *args]]  # what `ps` / `pgrep -f` see is unchanged
        publish(nsqd, topic, numbered(50))
        wait_for(lambda: drained(nsqd, topic, total=50), what="drained")
        p.send_signal(signal.SIGHUP)  # the handler of the new image
        wait_for(lambda: len(list(out.iterdir())) == 1, what="file closed on SIGHUP")
    finally:
        rc, stdout, _ = stop(p)
    assert rc == 0, log.text
    assert read_records(out) == numbered(50)
    summary = json.loads(stdout)
    assert summary["received"] == summary["finished"] == 50 and summary["files_closed"] == 1
    assert b"Traceback" not in log.text


def archives_in_the_first_image(p, nsqd, topic, n: int) -> int:
    """``p`` (a to-file that must not hand off) archives ``n`` messages; its exit code after SIGTERM."""
    log = StderrLog(p)
    try:
        wait_for(lambda: b"archiving topic" in log.text, what="subscribed")
        assert "NSQCLI_HANDOFF" not in environ_of(p.pid)
        publish(nsqd, topic, numbered(n))
        wait_for(lambda: drained(nsqd, topic, total=n), what="drained")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    return p.returncode


def test_no_handoff_runs_in_the_first_process(nsqd, topic, tmp_path):
    p = start(["-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(tmp_path),
               "--sync-interval", "0.2s"], env={"NSQCLI_NO_HANDOFF": "1"})
    assert archives_in_the_first_image(p, nsqd, topic, 5) == 0
    assert read_records(tmp_path) == numbered(5)


def catches_sigterm(pid: int) -> bool:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7])
def test_a_signal_at_any_moment_of_the_handoff_exits_with_its_code(nsqd, topic, tmp_path, delay):
    """SIGTERM before, during and after the exec: 143 (or 0 once the clean stop is installed),
    never a death by signal, a traceback, or a process that keeps running."""
    p = start(["-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(tmp_path)])
    wait_for(lambda: catches_sigterm(p.pid), what="the first image's signal handlers")  # before: any Python dies
    time.sleep(delay)
    rc, out, err = stop(p)
    assert rc in (0, 143), (rc, err)
    assert b"Traceback" not in err and out == b""


@pytest.mark.parametrize("value", ["0", "1", "2", "7", "3:1", "x", ""])
def test_a_stray_handoff_variable_is_one_error_line(value):
    """Naming stdin, stdout (both pipes here), stderr, a closed fd, a pipe with another inode,
    or nothing: refused, never read from or closed."""
    r = subprocess.run(NSQCLI + ["version"], env=clean_env({"NSQCLI_HANDOFF": value}), capture_output=True,
                       input=b'{"kind": "to-file", "spec": {}}', timeout=30)
    one_error_line(r, 1, "NSQCLI_HANDOFF is nsqcli's own")
    assert r.stdout == b""


def test_the_process_name_stays_the_console_scripts(nsqd, topic, tmp_path):
    """`pgrep nsqcli`, `killall -HUP nsqcli`, `ps -C nsqcli` match /proc/PID/comm, which an exec
    of the interpreter would rename to python3."""
    script = Path(sys.executable).parent / "nsqcli"
    p = subprocess.Popen([str(script), "to-file", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address,
                          "--output-dir", str(tmp_path)], stderr=subprocess.PIPE, env=clean_env())
    log = StderrLog(p)
    try:
        wait_for(lambda: b"archiving topic" in log.text, what="subscribed")
        assert "NSQCLI_HANDOFF" in environ_of(p.pid)
        assert open(f"/proc/{p.pid}/comm").read().strip() == "nsqcli"
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    assert p.returncode == 0, log.text


def test_a_program_read_from_stdin_is_not_run_again(nsqd, topic, tmp_path):
    """`python -` reads its program once: the exec would run an empty one. It stays here."""
    p = subprocess.Popen([sys.executable, "-", "to-file", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address,
                          "--output-dir", str(tmp_path), "--sync-interval", "0.2s"], stdin=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=clean_env())
    p.stdin.write(b"from nsqcli.entry import main\nmain()\n")
    p.stdin.close()
    assert archives_in_the_first_image(p, nsqd, topic, 3) == 0
    assert read_records(tmp_path) == numbered(3)


def test_a_spec_bigger_than_the_pipe_runs_in_the_first_image(tmp_path):
    """The spec is written before the exec, with no reader yet: one that does not fit the pipe
    at once must not block for ever (a pipe may hold only 8 KiB for a user over
    pipe-user-pages-soft; here the spec is bigger than a default 64 KiB pipe)."""
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\n"
                    "from nsqcli.entry import main\n"
                    "from nsqcli.cli import handoff\n"
                    "handoff.enable(main)\n"
                    "handoff.hand_off('to-file', {'topics': ['t' * 64] * 4000})\n"  # ~270 KB > a 64 KiB pipe
                    "print('ran here', sorted(__import__('os').listdir('/proc/self/fd')))\n")
    out = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, timeout=30, env=clean_env())
    assert out.returncode == 0 and out.stdout.startswith("ran here"), out.stderr
    assert out.stdout.split(" ", 2)[2].strip() == "['0', '1', '2', '3']"  # no pipe end left open (3: listdir's own)


def test_the_handed_off_image_imports_no_click():
    """What the new image loads to archive: no click, and none of the modules only click and
    dataclasses pull in (inspect, ast, typing) - the memory the hand-off exists to save."""
    code = ("import sys, nsqcli.entry, nsqcli.cli.handoff, nsqcli.cli.archiving, nsqcli.archive.archiver, "
            "nsqcli.archive.writer, nsqcli.records, nsqcli.client.consumer, nsqcli.client.http, nsqcli.cli.signals; "
            "print(sorted(m for m in ('click', 'inspect', 'ast', 'typing', 'dataclasses', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_config_goes_through_the_spec_unchanged():
    cfg = Config(max_in_flight=2500, max_attempts=0, auth_secret="s3cret", snappy=True, msg_timeout=30.0,
                 tls=TLSConfig(enabled=True, ca_file="/ca.pem", min_version="1.2", insecure_skip_verify=True),
                 on_notice=print, client_id="box")
    said = []
    back = archiving.config_from_spec(json.loads(json.dumps(archiving.config_spec(cfg))),
                                      type("App", (), {"warn": staticmethod(said.append)})())
    assert back == cfg
    back.on_notice("a")
    back.on_notice("a")
    assert said == ["a"]  # said once per run, as before the hand-off
    plain = archiving.config_from_spec(json.loads(json.dumps(archiving.config_spec(Config()))), None)
    assert plain == Config() and plain.on_notice is None


def test_handoff_keeps_open_descriptors(nsqd, topic, tmp_path):
    """stdout given as a pipe stays the same pipe across the exec: the --json summary reaches it."""
    r, w = os.pipe()
    p = subprocess.Popen(NSQCLI + ["to-file", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address,
                                   "--output-dir", str(tmp_path), "--json", "--sync-interval", "0.2s"],
                         stdout=w, stderr=subprocess.PIPE, env=clean_env())
    os.close(w)
    try:
        log = StderrLog(p)
        wait_for(lambda: b"archiving topic" in log.text, what="subscribed")
        publish(nsqd, topic, numbered(3))
        wait_for(lambda: drained(nsqd, topic, total=3), what="drained")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    with os.fdopen(r, "rb") as f:
        assert json.loads(f.read())["finished"] == 3
    assert p.returncode == 0


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_right_after_the_exec_waits_for_the_new_images_handlers(nsqd, topic, tmp_path, sig, code):
    """Sent the moment the new image exists (its environment has the hand-off), before it has
    imported anything: held blocked across the exec, then it ends the run with its exit code."""
    p = start(["-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(tmp_path)])
    deadline = time.monotonic() + 20
    while "NSQCLI_HANDOFF" not in environ_of(p.pid):
        assert time.monotonic() < deadline and p.poll() is None, "no hand-off"
    p.send_signal(sig)
    rc, out, err = stop(p, sig=0)
    assert rc == code, (rc, err)
    assert err.decode().splitlines()[-1].startswith("nsqcli: interrupted"), err


def test_sighup_at_any_moment_of_start_up_is_held_for_the_archive_never_fatal(nsqd, topic, tmp_path):
    """SIGHUP (logrotate's `killall -HUP nsqcli`) from nsqcli's first line on - while click
    parses, across the hand-off, while the archive starts: held until the archive's handler is in
    place, then done ("closing and moving 0 files"), and to-file runs on (review: until the
    hand-off it had its default action, and to-file ended saying nothing). The first moment is
    when /proc shows the early SIGTERM handler (nsqcli.entry: SIGHUP is held before it is
    installed); before that Python is starting, which no code of nsqcli can help."""
    runs = []
    try:
        for i, delay in enumerate([0, 0, 0.005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.25]):
            p = start(["-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(tmp_path / str(i))])
            wait_for(lambda: p.poll() is not None or catches(p.pid, signal.SIGTERM), 20, interval=0.0005,
                     what="nsqcli's early handlers")
            time.sleep(delay)
            p.send_signal(signal.SIGHUP)
            runs.append((delay, p, StderrLog(p)))
        for delay, p, log in runs:
            wait_for(lambda: p.poll() is not None or b"SIGHUP: closing and moving 0 files" in log.text,
                     20, what=f"the SIGHUP sent after {delay}s done")
            assert p.poll() is None, (delay, p.returncode, log.text)
    finally:
        for _, p, _ in runs:
            p.send_signal(signal.SIGTERM)
    for delay, p, log in runs:
        assert p.wait(30) == 0, (delay, p.returncode, log.text)
        log.thread.join(5)
        p.stdout.close()
        p.stderr.close()
        assert b"archiving topic" in log.text and b"interrupted" not in log.text, (delay, log.text)


def catches(pid: int, sig: int) -> bool:
    """The process has a handler for ``sig`` (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(status.split("SigCgt:")[1].split()[0], 16)
    return bool(caught & (1 << (sig - 1)))
