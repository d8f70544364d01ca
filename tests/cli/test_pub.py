"""`nsqcli pub` against real nsqd."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fakes import FakeNsqd
from helpers import clean_env, lookup_producers, run_nsqcli, topic_stats, wait_for
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
    code = ("import sys; before = set(sys.modules); import atexit; "
            "atexit.register(lambda: print(sorted(set(sys.modules) - before))); "
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


# 6 ------------------------------------------------------------------------------------------------
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
