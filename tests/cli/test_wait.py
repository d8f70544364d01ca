"""`nsqcli wait` against real nsqd: the CI gate returns when the condition holds, fails at the
first requeue, and names what was not met when --timeout passes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time

from tests.support.helpers import (NSQCLI, channel_stats, clean_env, http_post, lookup_producers, one_error_line, run_nsqcli,
                     wait_for)
from tests.support.inprocess import run_in_process

from nsqcli import Config, Consumer


def start_wait(*args):
    return subprocess.Popen(NSQCLI + ["wait", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env())


def backlog(nsqd, topic, n, channel="c"):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel=channel)
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(n)), topic=topic)


def exited_at(p, timeout=15):
    """(returncode, monotonic time it was seen exited, stdout, stderr)."""
    end = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < end:
        time.sleep(0.02)
    seen = time.monotonic()
    out, err = p.communicate(timeout=5)
    return p.returncode, seen, out, err.decode()


def test_drained_returns_0_within_1s_of_the_drain(nsqd, topic):
    backlog(nsqd, topic, 5)
    p = start_wait(topic, "c", "--drained", "--fail-on-requeue", "--nsqd-http-address", nsqd.http_address,
                   "--timeout", "20s")
    try:
        time.sleep(1.5)
        assert p.poll() is None, p.communicate()  # 5 messages waiting: not drained
        c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[nsqd.tcp_address])
        c.start()
        try:
            wait_for(lambda: (s := channel_stats(nsqd, topic, "c")) and s["depth"] == s["in_flight_count"]
                     == s["deferred_count"] == 0, interval=0.02, what="drained")
            drained = time.monotonic()
            rc, seen, out, err = exited_at(p)
        finally:
            c.stop()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 0, err
    assert seen - drained < 1.0, seen - drained
    assert out == b""  # stdout is data only: a gate prints none
    assert f"{topic}/c drained" in err and "Traceback" not in err


def test_fail_on_requeue_exits_1_within_1s_of_the_first_req(nsqd, topic):
    backlog(nsqd, topic, 1)
    p = start_wait(topic, "c", "--drained", "--fail-on-requeue", "--nsqd-http-address", nsqd.http_address,
                   "--timeout", "20s")
    try:
        # the wait has its baseline (requeue_count 0): it says what it waits for 5 s after its start,
        # after a look (a fixed sleep of 1.5 s could pass before the first look on a busy machine)
        line = p.stderr.readline()  # 'waiting (5s)', or 6s when a look took long
        assert re.match(rb"nsqcli: waiting \(\d+s\): ", line), line
        assert p.poll() is None
        c = Consumer(topic, "c", lambda m: m.requeue(delay=60, backoff=False), nsqd_tcp_addresses=[nsqd.tcp_address],
                     config=Config(max_backoff_duration=0))
        c.start()
        try:
            wait_for(lambda: channel_stats(nsqd, topic, "c")["requeue_count"] >= 1, interval=0.02, what="a REQ")
            requeued = time.monotonic()
            rc, seen, _, err = exited_at(p)
        finally:
            c.stop()
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 1 and seen - requeued < 1.0, (rc, seen - requeued, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("nsqcli: error: 1 message requeued since the wait started"), err
    assert f"{topic}/c requeue_count 0 -> 1 on nsqd {nsqd.http_address}" in line
    # depth, in-flight 0 and the message deferred: --drained alone would not have ended here
    assert channel_stats(nsqd, topic, "c")["deferred_count"] == 1


def test_timeout_exits_3_naming_each_unmet_condition(nsqd, topic):
    backlog(nsqd, topic, 2)
    t0 = time.monotonic()
    r = run_nsqcli(["wait", topic, "c", "--drained", "--depth-below", "1", "--timeout", "1.5s",
                    "--nsqd-http-address", nsqd.http_address])
    took = time.monotonic() - t0
    line = one_error_line(r, 3, r"^nsqcli: error: --timeout \(1.5s\) passed; not met: ")
    assert f"{topic}/c not drained: depth 2, in flight 0, deferred 0 (on {nsqd.http_address})" in line
    assert f"{topic}/c depth 2, not below 1" in line
    assert 1.4 < took < 3.5, took
    r = run_nsqcli(["wait", topic, "nochannel", "--drained", "--timeout", "1s", "--nsqd-http-address",
                    nsqd.http_address])
    one_error_line(r, 3, rf"channel {topic}/nochannel exists on no nsqd \(asked {nsqd.http_address}\)")


def test_exists_returns_when_the_topic_is_created(nsqd, topic):
    p = start_wait(topic, "--exists", "--nsqd-http-address", nsqd.http_address, "--timeout", "20s")
    try:
        time.sleep(1.0)
        assert p.poll() is None
        http_post(nsqd.http_address, "/topic/create", topic=topic)
        created = time.monotonic()
        rc, seen, _, err = exited_at(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 0 and seen - created < 1.0, (rc, seen - created, err)


def test_ready_waits_for_a_stopped_then_a_killed_nsqd(nsqd_factory):
    node = nsqd_factory()
    os.kill(node.pid, signal.SIGSTOP)
    try:
        r = run_nsqcli(["wait", "--ready", "--nsqd-http-address", node.http_address, "--timeout", "1s"])
        one_error_line(r, 3, rf"not met: nsqd {node.http_address} not ready \(.*no complete answer within")
        p = start_wait("--ready", "--nsqd-http-address", node.http_address, "--timeout", "20s")
        time.sleep(1.5)
        assert p.poll() is None
    finally:
        os.kill(node.pid, signal.SIGCONT)
    continued = time.monotonic()
    rc, seen, _, err = exited_at(p)
    assert rc == 0 and seen - continued < 1.0, (rc, seen - continued, err)

    node.kill()
    p = start_wait("--ready", "--nsqd-http-address", node.http_address, "--timeout", "30s")
    try:
        time.sleep(1.0)
        assert p.poll() is None
        node.restart()  # returns once it answers /ping
        started = time.monotonic()
        rc, seen, _, err = exited_at(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 0 and seen - started < 1.0, (rc, seen - started, err)


def test_usage_errors():
    r = run_in_process(["wait"])
    one_error_line(r, 2, r"nothing to wait for: give --ready, --exists, --drained or --depth-below "
                         r"\(see 'nsqcli wait --help'\)")
    r = run_in_process(["wait", "--drained"])
    one_error_line(r, 2, r"--drained needs a TOPIC")
    r = run_in_process(["wait", "--ready", "--timeout", "0"])
    assert r.returncode == 2


def test_the_readme_ci_smoke_test_runs_as_written(tmp_path):
    """README.md's CI smoke block, in bash -e, against a sandbox of its own (its NSQCLI_* variables)."""
    import re
    import sys
    from pathlib import Path

    from nsqcli.sandbox import Sandbox

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    m = re.search(r"<!-- ci-smoke -->\n```sh\n(.*?)```\n<!-- /ci-smoke -->", text, re.S)
    assert m, "README.md lost its ci-smoke block"
    bindir = Path(sys.executable).parent
    with Sandbox(base_dir=str(tmp_path / "nsq")) as sb:
        env = clean_env({**sb.env(), "PATH": f"{bindir}:{os.environ['PATH']}", "NSQCLI_CONFIG_DIR": str(tmp_path)})
        r = subprocess.run(["bash", "-e", "-c", m.group(1) + "wait\n"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=90)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[-3] == "NSQ OK: 1 nsqd up, 1 channel, depth 0, in flight 0, requeued 0, timed out 0", r.stdout
        assert lines[-1].split() == ["orders/billing", "0", "0", "0", "0", "0", "0"]
        assert "Traceback" not in r.stderr
        # the gate fails the script when the service under test REQs (the same lines, a consumer that REQs
        # each delivery: a poison message comes back and is REQ'd again, after the wait has its baseline)
        script = m.group(1).replace("nsqcli tail orders -c billing -n 1 > /dev/null &",
                                    f"{sys.executable} -c '{_REQ}' {sb.nsqd.tcp_address} >/dev/null 2>&1 & trap \"kill $!\" EXIT")
        r = subprocess.run(["bash", "-e", "-c", script + "echo not reached\n"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=90)
        assert r.returncode == 1 and "not reached" not in r.stdout, r.stdout + r.stderr
        # one REQ, or more when the consumer's next REQ (0.2 s later) came before the wait's next poll
        assert re.search(r"\d+ messages? requeued since the wait started", r.stderr), r.stderr


_REQ = ("import sys, time; from nsqcli import Config, Consumer; "
        "c = Consumer(\"orders\", \"billing\", lambda m: m.requeue(delay=0.2, backoff=False), "
        "nsqd_tcp_addresses=[sys.argv[1]], config=Config(max_backoff_duration=0)); c.start(); time.sleep(60)")


def test_through_nsqlookupd_and_depth_below(sandbox, nsqd, topic):
    p = start_wait(topic, "c", "--exists", "--depth-below", "3", "--lookupd-http-address",
                   sandbox.lookupd.http_address, "--timeout", "20s")
    try:
        time.sleep(1.0)
        assert p.poll() is None
        backlog(nsqd, topic, 2)
        wait_for(lambda: lookup_producers(sandbox.lookupd, topic), interval=0.02, what="registered")
        registered = time.monotonic()
        rc, seen, _, err = exited_at(p)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 0 and seen - registered < 1.0, (rc, seen - registered, err)
    r = run_nsqcli(["wait", topic, "c", "--depth-below", "2", "--timeout", "1s", "--lookupd-http-address",
                    sandbox.lookupd.http_address])
    one_error_line(r, 3, rf"not met: {topic}/c depth 2, not below 2$")


def test_sigterm_and_sigint_end_the_wait_at_once():
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        with socket.socket() as silent:  # accepts, never answers: the wait is inside a request
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            p = start_wait("--ready", "--nsqd-http-address", "127.0.0.1:%d" % silent.getsockname()[1])
            silent.settimeout(20)
            conn, _ = silent.accept()
            with conn:
                assert conn.recv(4096).startswith(b"GET ")  # the wait is inside its request
                p.send_signal(sig)
                sent = time.monotonic()
                rc, seen, out, err = exited_at(p)
        assert (rc, out) == (code, b"") and seen - sent < 1.0, (rc, err)
        assert err == f"nsqcli: interrupted ({sig.name})\n"


# -- refusals: bad input (one line, the documented exit code) --------------------------------------------
import pytest  # noqa: E402
from tests.support.refusals import DEAD, bad_input, ids  # noqa: E402

BAD_INPUT = [
    (["wait"], 2, r"nothing to wait for: give --ready, --exists, --drained or --depth-below"),
    (["wait", "--drained"], 2, r"--drained needs a TOPIC \(nsqcli wait TOPIC \[CHANNEL\] --drained"),
    (["wait", "t", "c", "--depth-below", "-1"], 2, r"'--depth-below': -1 is not in the range x>=1"),
    (["wait", "--ready", "--interval", "0"], 2, r"'--interval': must be more than 0"),
    (["wait", "--ready", "--timeout", "0"], 2, r"'--timeout': must be more than 0 \(there is no endless wait"),
    (["wait", "--ready", "--nsqd-http-address", DEAD, "--timeout", "1s"], 3,
     r"--timeout \(1s\) passed; not met: nsqd 127\.0\.0\.1:1 not ready"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


def test_drained_must_hold_on_two_looks_in_a_row():
    """A message nsqd has taken off the queue for a client, not yet in flight, is in no count for
    that moment: one look saw "drained" with a consumer REQing every delivery (CI68). --drained
    holds on two looks in a row, an interval apart, before it is said: here the second look finds
    the message again, and the wait goes on to its --timeout (exit 3), where it said ready."""
    import json as _json

    from tests.support.fakes import FakeLookupd, http_answer, http_request

    def stats(depth):
        channel = {"channel_name": "c", "depth": depth, "in_flight_count": 0, "deferred_count": 0,
                   "requeue_count": 0, "timeout_count": 0, "clients": []}
        return _json.dumps({"version": "1.3.0", "health": "OK", "start_time": 1,
                            "topics": [{"topic_name": "t", "depth": 0, "channels": [channel]}]}).encode()

    looks = []

    def script(peer):
        while True:
            try:
                http_request(peer)
            except EOFError:
                return
            looks.append(1)
            http_answer(peer, 200, stats(0 if len(looks) == 1 else 1))  # drained at the first look only

    with FakeLookupd(script) as fake:
        r = run_nsqcli(["wait", "t", "c", "--drained", "--nsqd-http-address", fake.address, "--interval", "0.2s",
                        "--timeout", "1.5s"])
    assert r.returncode == 3 and len(looks) >= 3, (r.returncode, len(looks), r.stderr)
    assert b"not drained: depth 1" in r.stderr, r.stderr
