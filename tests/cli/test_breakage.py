"""Reproductions of bugs found by an adversarial review of the CLI layer (grammar, footguns,
pub's fast path, mpub --linger, to-file start-up checks). Each test fails while its bug is there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import NSQCLI, clean_env, topic_stats, wait_for


def _run(args, env=None, close=(), input=None, timeout=30):
    """nsqcli with the file descriptors in ``close`` closed (as the shell's ``<&-``, ``>&-``, ``2>&-``)."""
    def pre():
        for fd in close:
            os.close(fd)

    kw = {"stdin": subprocess.DEVNULL} if input is None else {"input": input}
    return subprocess.run(NSQCLI + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=clean_env(env), preexec_fn=pre, timeout=timeout, **kw)


def _both(args, env=None, close=()):
    """(fast path, click path) results: (exit code, stdout, stderr)."""
    out = []
    for off in ("0", "1"):
        r = _run(args, {**(env or {}), "NSQCLI_NO_FAST_PATH": off}, close)
        out.append((r.returncode, r.stdout, r.stderr))
    return out


# -- pub's fast path must behave exactly like the click command -----------------------------------

def test_fast_path_with_stdin_closed_is_the_empty_message_usage_error(topic):
    """`nsqcli pub TOPIC <&-`: click says "the message is empty" (exit 2); the fast path said
    "internal error: AttributeError: 'NoneType' object has no attribute 'isatty'" (exit 1)."""
    fast, slow = _both(["pub", topic, "--nsqd-tcp-address", "127.0.0.1:1"], close=(0,))
    assert slow[0] == 2 and b"the message is empty" in slow[2], slow
    assert fast == slow


def test_fast_path_with_stdout_closed_and_json_exits_0_like_click(nsqd, topic):
    """`nsqcli pub TOPIC m --json >&-`: click exits 0 quietly (a closed stdout is a closed pipe);
    the fast path said "internal error: AttributeError: 'NoneType' object has no attribute
    'write'" and exited 1 - after the message was published."""
    fast, slow = _both(["pub", topic, "m", "--json", "--nsqd-tcp-address", nsqd.tcp_address], close=(1,))
    assert slow[0] == 0 and slow[2] == b"", slow
    assert fast == slow
    assert topic_stats(nsqd, topic)["message_count"] == 2


# -- a closed stderr must not change the exit code -------------------------------------------------

@pytest.mark.parametrize("off", ["0", "1"], ids=["fast", "click"])
def test_closed_stderr_keeps_the_usage_exit_code(off):
    """`nsqcli pub 2>&-` / `nsqcli pub t '' 2>&-`: exit 2 (usage error) with or without a stderr;
    write_stderr/_say catch OSError and ValueError but sys.stderr is None (AttributeError), so
    every error exit became 1 (a deadline's 3 too)."""
    r = _run(["pub", "t", ""], {"NSQCLI_NO_FAST_PATH": off}, close=(2,))
    assert r.returncode == 2
    r = _run(["pub"], {"NSQCLI_NO_FAST_PATH": off}, close=(2,))
    assert r.returncode == 2


def test_closed_stderr_keeps_the_deadline_exit_code():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    try:
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        r = _run(["pub", "t", "m", "--nsqd-tcp-address", addr, "--timeout", "300ms"], close=(2,))
        assert r.returncode == 3
    finally:
        s.close()


# -- mpub --json after an interrupt ----------------------------------------------------------------

def test_mpub_json_error_says_the_run_was_interrupted(nsqd, topic):
    """An interrupted mpub's JSON summary had "error": "" (str() of an Interrupted without a
    message): falsy, so `if doc["error"]` reads the interrupted run as a success."""
    p = subprocess.Popen(NSQCLI + ["mpub", topic, "--json", "--linger", "50ms", "--nsqd-tcp-address",
                                   nsqd.tcp_address], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=clean_env())
    try:
        p.stdin.write(b"one\n")
        p.stdin.flush()
        wait_for(lambda: (topic_stats(nsqd, topic) or {}).get("message_count") == 1, what="the first record")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    doc = json.loads(out)
    assert doc["published"] == 1 and doc["resume_skip"] == 1
    assert doc["error"], doc  # non-empty: the run did not finish


# -- to-file: files never leave --output-dir -------------------------------------------------------

def test_to_file_topic_dot_dot_does_not_leave_output_dir(nsqd_factory, tmp_path):
    """'..' is a valid NSQ topic name (anyone who can publish can create it; --topic-pattern picks
    it up). With a per-topic directory layout, --filename-format '<TOPIC>/<REV>x.log', the file
    was written to OUTPUT_DIR/../x.log: the "--filename-format leaves --output-dir" check looks
    at the format with the tokens replaced by 'x', not at the names made from real topics."""
    nsqd = nsqd_factory()
    r = subprocess.run(NSQCLI + ["pub", "..", "escaped", "--nsqd-tcp-address", nsqd.tcp_address],
                       capture_output=True, env=clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "archive" / "out"
    out.mkdir(parents=True)
    p = subprocess.Popen(NSQCLI + ["to-file", "-t", "..", "--output-dir", str(out), "--filename-format",
                                   "<TOPIC>/<REV>escaped.log", "--sync-interval", "200ms", "--no-live",
                                   "--nsqd-tcp-address", nsqd.tcp_address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    try:
        time.sleep(3)
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    escaped = Path(tmp_path / "archive" / "escaped.log")
    assert not escaped.exists(), f"{escaped} written outside --output-dir {out}"


# -- admin: the port hints -------------------------------------------------------------------------

@pytest.mark.parametrize("action", [["channel", "delete"], ["channel", "empty"], ["topic", "pause"]])
def test_a_missing_topic_or_channel_is_not_called_a_wrong_port(action, nsqd, topic):
    """nsqd answers 404 TOPIC_NOT_FOUND / CHANNEL_NOT_FOUND for a topic or channel it does not
    have (a typo); port_hint matches any "HTTP 404" and tells the user the RIGHT port is wrong:
    "(it answered 404 like nsqlookupd HTTP port: give nsqd's HTTP port, usually 4151)"."""
    from helpers import http_post, run_nsqcli

    http_post(nsqd.http_address, "/topic/create", topic=topic)
    args = [*action, topic, *(["no_such_channel"] if action[0] == "channel" else []),
            "--nsqd-http-address", nsqd.http_address, "--yes"]
    if action[0] == "topic":
        args[2] = topic + "_no_such_topic"
    r = run_nsqcli(args)
    assert r.returncode == 1
    assert b"HTTP port" not in r.stderr, r.stderr.decode()


def test_topic_create_on_nsqlookupds_port_is_not_reported_done(nsqd, lookupd, topic):
    """`topic create T --nsqd-http-address <nsqlookupd's HTTP port>`: nsqlookupd has a
    /topic/create too, so this printed "ok nsqd ...: POST /topic/create" and "create done on
    1 node(s)", exit 0 - while no nsqd has the topic (only a registration in nsqlookupd)."""
    from helpers import http_post, run_nsqcli

    try:
        r = run_nsqcli(["topic", "create", topic, "--nsqd-http-address", lookupd.http_address])
        assert topic_stats(nsqd, topic) is None
        assert r.returncode != 0, r.stdout.decode() + r.stderr.decode()
    finally:
        http_post(lookupd.http_address, "/topic/delete", topic=topic)


# -- a closed stdout: help and version too ---------------------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["pub", "--help"], [], ["-V"], ["topic"]],
                         ids=["--help", "pub --help", "bare", "-V", "group"])
def test_help_and_version_to_a_closed_stdout_exit_0(args):
    """`nsqcli --help >&-` and `nsqcli --help | head -0` exit 1 (click.main turns the EPIPE of its
    own echo into sys.exit(1)), while `nsqcli help pub >&-` and every command's output exit 0:
    a closed stdout is meant to end every command as a closed pipe does, quietly with 0."""
    r = _run(args, close=(1,))
    assert (r.returncode, r.stderr) == (0, b"")


def test_to_file_datetime_format_cannot_leave_output_dir(nsqd, topic, tmp_path):
    """The leaves-dir check replaces <DATETIME> by 'x' before looking, so --datetime-format
    '/../../y' (or --host-identifier '../..') carries the file out of --output-dir unchecked:
    OUTPUT_DIR/<topic>./../../y.log is written as OUTPUT_DIR/../y.log."""
    from helpers import run_nsqcli

    assert run_nsqcli(["pub", topic, "m", "--nsqd-tcp-address", nsqd.tcp_address]).returncode == 0
    out = tmp_path / "a" / "out"
    out.mkdir(parents=True)
    p = subprocess.Popen(NSQCLI + ["to-file", "-t", topic, "--output-dir", str(out), "--filename-format",
                                   "<TOPIC>.<DATETIME>.log", "--datetime-format", "/../../escaped",
                                   "--sync-interval", "200ms", "--no-live", "--nsqd-tcp-address", nsqd.tcp_address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    try:
        try:
            p.wait(timeout=3)  # refused at start-up (exit 2) is the fix
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert not (tmp_path / "a" / "escaped.log").exists()
