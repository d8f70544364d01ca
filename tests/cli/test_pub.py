"""`nsqcli pub` against real nsqd."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fakes import FakeNsqd
from faultproxy import FaultProxy
from helpers import NSQCLI, clean_env, lookup_producers, run_nsqcli, topic_stats, wait_for
from hung import cluster  # noqa: F401 - the fixture
from helpers import run_nsqcli as run


@pytest.fixture
def env(sandbox):
    return {"NSQCLI_NSQD_TCP_ADDRESS": sandbox.nsqd.tcp_address}


#: never imported by a plain `nsqcli pub` (the fast path in nsqcli.entry, with the client core)
PUB_FORBIDDEN = ("click", "rich", "rich.live", "nsqcli.cli", "nsqcli.client.consumer", "nsqcli.contexts",
                 "pyspark", "ssl", "dataclasses", "inspect", "typing", "uuid", "datetime", "pathlib",
                 "urllib", "ipaddress", "platform", "concurrent.futures", "logging", "encodings.idna",
                 "importlib.metadata", "tomllib")


def test_pub_argument_and_stdin(nsqd, env, topic):
    assert run(["pub", "-t", topic, "hello"], env).returncode == 0
    binary = bytes(range(256)) * 3
    r = run(["pub", "-t", topic], env, input=binary)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b""
    assert topic_stats(nsqd, topic)["message_count"] == 2
    r = run(["tail", "-t", topic, "-n", "2", "--format", "json", "-c", "c"], env)
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert recs[0]["body"] == "hello"
    import base64
    assert base64.b64decode(recs[1]["body_base64"]) == binary


def test_pub_errors_are_one_line_with_exit_codes(env, topic):
    r = run(["pub", "-t", "bad topic", "x"], env)
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"invalid topic name 'bad topic'" in r.stderr
    r = run(["pub", "-t", topic, "--nsqd-tcp-address", "127.0.0.1:1", "x"])
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1
    assert b"127.0.0.1:1: cannot connect: Connection refused" in r.stderr and b"Traceback" not in r.stderr
    r = run(["pub", "-t", topic], env, input=b"")
    assert r.returncode == 2 and b"empty" in r.stderr
    r = run(["pub", "-t", topic, "--defer", "soon", "x"], env)
    assert r.returncode == 2 and b"not a duration" in r.stderr


def test_pub_fanout_and_lookupd(sandbox, nsqd, extra_nsqd, lookupd, topic):
    other = extra_nsqd()
    r = run(["pub", "-t", topic, "--fanout", "--nsqd-tcp-address", nsqd.tcp_address,
             "--nsqd-tcp-address", other.tcp_address, "both"])
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == 1 and topic_stats(other, topic)["message_count"] == 1
    wait_for(lambda: lookup_producers(lookupd, topic), what="registered")
    r = run(["pub", "-t", topic, "--lookupd-http-address", lookupd.http_address, "via-lookupd"])
    assert r.returncode == 0, r.stderr
    r = run(["pub", "-t", topic + "_unknown", "--lookupd-http-address", lookupd.http_address, "x"])
    assert r.returncode == 1 and b"no nsqd carries topic" in r.stderr


def test_pub_does_not_import_heavy_modules(nsqd, env, topic):
    """A real publish through the console script's entry: the modules it loaded, at exit (not
    those loaded before it started, e.g. by an editable install's import finder)."""
    code = ("import sys; before = set(sys.modules); import os; _exit = os._exit\n"
            "def leave(code):\n    print(sorted(set(sys.modules) - before)); sys.stdout.flush(); _exit(code)\n"
            "os._exit = leave\n"  # the fast path leaves through os._exit (no teardown, no atexit)
            "sys.argv = ['nsqcli', 'pub', sys.argv[1], 'hello']; from nsqcli.entry import main; main()")
    r = subprocess.run([sys.executable, "-c", code, topic], capture_output=True, text=True,
                       env={**clean_env(env)}, timeout=30)
    assert r.returncode == 0, r.stderr
    loaded = set(eval(r.stdout))
    assert "nsqcli.client.producer" in loaded  # it did publish, in this process
    assert not loaded & set(PUB_FORBIDDEN), sorted(loaded & set(PUB_FORBIDDEN))
    code = ("import sys, nsqcli.cli.commands.pub, nsqcli.client.producer; "
            "bad = [m for m in ('rich.live', 'nsqcli.client.consumer', 'pyspark', 'rich', 'ssl') if m in sys.modules]; "
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr  # the click command (any other argv) too


def test_positional_topic_and_json_results(nsqd, topic):
    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address}
    r = run_nsqcli(["pub", topic, "hello", "--json"], env)
    assert json.loads(r.stdout) == {"topic": topic, "bytes": 5, "acknowledged_by": [nsqd.tcp_address], "published": 1}
    r = run_nsqcli(["mpub", "-t", topic, "-n", "3", "--json"], env, input=b"a\nb\nc\nd\ne\n")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and (doc["published"], doc["resume_skip"], doc["failed"], doc["error"]) == (3, 3, 0, None)
    r = run_nsqcli(["mpub", "-t", topic, "--skip", str(doc["resume_skip"]), "--json"], env, input=b"a\nb\nc\nd\ne\n")
    assert json.loads(r.stdout)["published"] == 2
    r = run_nsqcli(["tail", topic, "-c", "all", "-n", "6"], env)
    assert r.stdout == b"hello\na\nb\nc\nd\ne\n"


@pytest.mark.parametrize("reply", [b"CLOSE_WAIT", b"E_WHATEVER?"])
def test_pub_fails_unless_nsqd_said_ok(reply):
    def script(peer):
        peer.handshake()
        peer.respond(reply)
        peer.silence()

    with FakeNsqd(script) as fake:
        r = run(["pub", "-t", "t", "--nsqd-tcp-address", fake.address, "--timeout", "3s", "x"])
    assert r.returncode == 1, r.stderr
    assert reply[:10] in r.stderr and b"expected OK" in r.stderr or b"CLOSE_WAIT" in r.stderr


# -- issue 33: the deadline counts from process start; an interrupt after the PUB says so ---------
def _both_paths(args, env=None):
    """Run `nsqcli pub ARGS` on the fast path and through click at the same time: [(rc, stdout,
    stderr, seconds from Popen to exit)] for (fast, click)."""
    import time

    procs = []
    for off in ("0", "1"):
        t0 = time.monotonic()
        procs.append((subprocess.Popen(NSQCLI + ["pub", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL,
                                       env=clean_env({**(env or {}), "NSQCLI_NO_FAST_PATH": off})), t0))
    out = []
    for p, t0 in procs:
        o, e = p.communicate(timeout=60)
        out.append((p.returncode, o, e, time.monotonic() - t0))
    return out


def test_the_deadline_includes_the_handshake(nsqd, topic):
    """Every answer 1.5 s late: the handshake spends 1.5 s of --timeout 2s, so PUB's OK (at ~3 s)
    comes after it - exit 3 at 2 s, not 0 at 3 s (the wait for OK was the whole --timeout,
    counted after the handshake); the same line on both paths."""
    with FaultProxy(nsqd.tcp_address, latency=1.5) as proxy:
        runs = _both_paths([topic, "m", "--timeout", "2s", "--nsqd-tcp-address", proxy.address])
    for rc, out, err, secs in runs:
        assert rc == 3 and out == b"", err
        assert err.startswith(b"nsqcli: error: --timeout passed: not known whether published: ") \
            and err.count(b"\n") == 1 and b"no answer from nsqd before the deadline" in err, err
        assert 1.9 <= secs <= 2.8, secs  # from Popen: the interpreter's start-up is inside the deadline too
    assert runs[0][:3] == runs[1][:3]


def test_a_slow_handshake_may_spend_the_whole_deadline(nsqd, topic):
    """nsqd's answers trickled a byte at a time: the handshake takes ~7 s, more than the 6 s a
    handshake gets on its own (dial 1 s + 5 s) - with --timeout 15s it is given the time (it
    failed with exit 3 at 6 s, the deadline unspent)."""
    with FaultProxy(nsqd.tcp_address, trickle=0.028) as proxy:
        runs = _both_paths([topic, "m", "--timeout", "15s", "--json", "--nsqd-tcp-address", proxy.address])
    for rc, out, err, secs in runs:
        assert rc == 0 and err == b"", err
        assert json.loads(out)["acknowledged_by"] == [proxy.address]
        assert 6.3 < secs < 14, secs  # past the old 6 s bound: the test could fail
    assert topic_stats(nsqd, topic)["message_count"] == 2


def test_an_interrupt_after_the_pub_was_written_says_it_may_be_published(nsqd, topic):
    """nsqd got the PUB (and published it) but its OK never comes back: SIGINT then must not say
    only "interrupted" - the message is in nsqd."""
    import signal

    with FaultProxy(nsqd.tcp_address, stall_on=b"PUB ") as proxy:
        results = []
        for off in ("0", "1"):
            p = subprocess.Popen(NSQCLI + ["pub", topic, "m", "--nsqd-tcp-address", proxy.address], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=clean_env({"NSQCLI_NO_FAST_PATH": off}))
            held = len(results) + 1
            wait_for(lambda: (topic_stats(nsqd, topic) or {}).get("message_count") == held or p.poll() is not None,
                     20, what="the PUB in nsqd")
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=10)
            proxy.stalled.clear()  # the next run's handshake is answered
            results.append((p.returncode, out, err))
    for rc, out, err in results:
        assert rc == 130 and out == b"", err
        assert err == (f"nsqcli: interrupted (SIGINT): the message was sent to {proxy.address} and may have been "
                       "published (no answer from nsqd yet)\n").encode(), err
    assert topic_stats(nsqd, topic)["message_count"] == 2


def test_a_pub_sent_again_after_a_lost_connection_says_it_may_be_a_duplicate(nsqd, extra_nsqd, topic):
    """The first nsqd got the PUB (and published it), the connection was lost before its OK:
    the message goes to the next nsqd - exit 0, and one warning line says it may be in both."""
    second = extra_nsqd()
    runs = []
    for off in ("0", "1"):  # one after the other: the proxy cuts every connection once a PUB went by
        with FaultProxy(nsqd.tcp_address, cut_on=b"PUB ") as proxy:
            r = run_nsqcli(["pub", topic, "m", "--json", "--nsqd-tcp-address", proxy.address, "--nsqd-tcp-address",
                            second.tcp_address], {"NSQCLI_NO_FAST_PATH": off})
        runs.append((r.returncode, r.stdout, r.stderr.replace(proxy.address.encode(), b"PROXY")))
    for rc, out, err in runs:
        assert rc == 0, err
        assert json.loads(out)["acknowledged_by"] == [second.tcp_address]
        assert err == (f"nsqcli: warning: the message was sent again to {second.tcp_address} after the connection "
                       "to PROXY was lost before nsqd answered: it may be published there too (a "
                       "possible duplicate)\n").encode(), err
    assert runs[0] == runs[1]
    assert topic_stats(nsqd, topic)["message_count"] == 2 and topic_stats(second, topic)["message_count"] == 2


@pytest.mark.parametrize("cmd", ["pub", "pub-click", "mpub"])
def test_a_hung_first_nsqd_leaves_the_next_one_its_turn_within_the_timeout(cluster, topic, cmd):
    """The first nsqd hangs (SIGSTOP: its kernel still accepts), the second is healthy: with
    --timeout 3s the first gets its share of the deadline, not all of it (exit 3 at 2 s, the
    healthy nsqd never tried, before)."""
    import time

    from hung import stopped

    hung, healthy = cluster.nsqds[:2]
    addrs = ["--nsqd-tcp-address", hung.tcp_address, "--nsqd-tcp-address", healthy.tcp_address, "--timeout", "3s"]
    args = ["mpub", "-t", topic, *addrs] if cmd == "mpub" else ["pub", topic, "hi", *addrs]
    env = {"NSQCLI_NO_FAST_PATH": "1"} if cmd == "pub-click" else {}
    with stopped(hung):
        t0 = time.monotonic()
        r = run(args, env, input=b"a\nb\n" if cmd == "mpub" else None)
        took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert topic_stats(healthy, topic)["message_count"] == (2 if cmd == "mpub" else 1)
    assert took < 3.0, took


@pytest.mark.parametrize("off", ["", "1"])  # the fast path and the click command say the same
def test_a_given_timeout_bounds_reading_stdin_the_default_starts_at_its_end(nsqd, topic, off):
    import time

    import shlex

    env = clean_env({"NSQCLI_NO_FAST_PATH": off, "NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address})
    slow, cli = "sleep 3; echo hi", shlex.join(NSQCLI)
    import os

    r_end, w_end = os.pipe()  # a writer that never closes its end
    try:
        p = subprocess.Popen([*NSQCLI, "pub", topic, "--timeout", "1s"], stdin=r_end, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        t0 = time.monotonic()
        try:
            out, err = p.communicate(timeout=10)
        finally:
            p.kill()
    finally:
        os.close(r_end)
        os.close(w_end)
    took = time.monotonic() - t0
    assert p.returncode == 3 and err.decode() == (
        "nsqcli: error: --timeout passed while reading the message from stdin (0 bytes read, no end of input "
        "yet): nothing was published\n")
    assert took < 2.0, took
    # the default --timeout (10s) starts at the end of input: a slow producer is waited for
    r = subprocess.run(["bash", "-c", f"({slow}) | {cli} pub {topic}"], capture_output=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == 1


@pytest.mark.parametrize("off", ["", "1"])
def test_a_big_message_lost_with_its_connection_is_named_as_the_likely_cause(nsqd, topic, off):
    """nsqd's HTTP port unknown (a proxy): its limit cannot be asked, and its refusal of a
    message over it can be lost to the reset while the message is still being written (played:
    answers held back from the PUB on, with --timeout 2s). Both paths say the size is the likely cause."""
    with FaultProxy(nsqd.tcp_address, stall_on=b"PUB ") as proxy:
        r = run(["pub", topic, "--nsqd-tcp-address", proxy.address, "--timeout", "2s"],
                {"NSQCLI_NO_FAST_PATH": off}, input=b"x" * 1_100_000)
    assert r.returncode in (1, 3), r.stderr  # nsqd's close after its refusal or the deadline
    assert r.stderr.decode().rstrip().endswith(
        "; the message is 1100000 bytes, over nsqd's default --max-msg-size (1048576): nsqd may have refused it "
        "and closed the connection before its answer was read"), r.stderr
