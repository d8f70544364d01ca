"""`nsqcli lookup` against real nsqlookupd."""

from __future__ import annotations

import json
import time

from tests.support.fakes import FakeLookupd, http_request, lookupd_trickle
from tests.support.helpers import http_get_json, http_post, one_error_line, run_nsqcli, wait_for
from tests.support.helpers import run_nsqcli as run

from nsqcli.sandbox import NsqdOptions


def test_lookup_of_an_unknown_topic_fails(lookupd, topic):
    r = run_nsqcli(["lookup", topic, "--lookupd-http-address", lookupd.http_address])
    assert r.stdout == b""
    one_error_line(r, 1, rf"topic '{topic}' is unknown to nsqlookupd {lookupd.http_address}")


def test_lookup_respects_a_trickling_lookupd():
    with FakeLookupd(lookupd_trickle) as fake:
        t0 = time.monotonic()
        r = run(["lookup", "--lookupd-http-address", fake.address], timeout=30)
        assert time.monotonic() - t0 < 12
    assert r.returncode == 1 and b"no complete answer within" in r.stderr, r.stderr


def test_lookup_union_with_one_lookupd_down(sandbox, nsqd, lookupd, extra_nsqd, topic):
    lookupd2 = sandbox._make_lookupd()
    lookupd2.log_path = sandbox.base_dir / "nsqlookupd2.log"
    lookupd2.start()
    try:
        # a node registered with BOTH lookupds, carrying another topic
        both = extra_nsqd(NsqdOptions(extra_args=[f"--lookupd-tcp-address={lookupd2.tcp_address}"]))
        http_post(nsqd.http_address, "/pub", b"x", topic=topic + "_one")
        http_post(both.http_address, "/pub", b"x", topic=topic + "_two")
        http_post(both.http_address, "/channel/create", topic=topic + "_two", channel="ch")
        wait_for(lambda: topic + "_two" in http_get_json(lookupd2.http_address, "/topics")["topics"] and
                 topic + "_one" in http_get_json(lookupd.http_address, "/topics")["topics"], what="registered")
        args = ["lookup", "--json", "--lookupd-http-address", lookupd.http_address,
                "--lookupd-http-address", lookupd2.http_address, "--lookupd-http-address", "127.0.0.1:1"]
        r = run(args)
        assert r.returncode == 0, r.stderr
        assert b"nsqlookupd failed: http://127.0.0.1:1/nodes" in r.stderr
        doc = json.loads(r.stdout)
        topics = {t["topic"]: t for t in doc["topics"]}
        assert topics[topic + "_one"]["producers"][0]["tcp_address"] == nsqd.tcp_address
        two = topics[topic + "_two"]
        assert two["channels"] == ["ch"] and [p["tcp_address"] for p in two["producers"]] == [both.tcp_address]
        assert sorted(doc["lookupds"]["answered"]) == sorted([lookupd.http_address, lookupd2.http_address])
        # --topic: exactly the addresses a consumer would connect to
        r = run(["lookup", "--topic", topic + "_two", "--lookupd-http-address", lookupd2.http_address])
        assert r.returncode == 0 and both.tcp_address.encode() in r.stdout and b"channels: ch" in r.stdout
        # --nodes: every node with its topics, plain aligned text when not a TTY
        r = run(["lookup", "--nodes", "--lookupd-http-address", lookupd.http_address])
        lines = r.stdout.decode().splitlines()
        assert lines[0].split() == ["NODE", "(TCP)", "HTTP", "HOSTNAME", "VERSION", "TOPICS"]
        assert any(line.startswith(nsqd.tcp_address) and topic + "_one" in line for line in lines)
        # nobody answers: exit 1
        r = run(["lookup", "--lookupd-http-address", "127.0.0.1:1"])
        assert r.returncode == 1 and b"no nsqlookupd answered" in r.stderr
    finally:
        lookupd2.stop()


def test_a_slow_answer_that_never_comes_is_called_slow_not_a_wrong_port():
    """A server that takes its time and then closes without a word (or mid-head) is named for
    what it did and how long it took - not "is this the HTTP port?" (make bench's clean-up
    once died on a slow topic delete reported that way)."""
    from nsqcli.client.http import http_json
    from nsqcli.errors import LookupdError

    def slow_then_close(peer):
        http_request(peer)
        peer.server.stopped.wait(1.2)

    def slow_then_cut(peer):
        http_request(peer)
        peer.sock.sendall(b"HTTP/1.1 200 OK\r\nContent-")
        peer.server.stopped.wait(1.2)

    for script, words in ((slow_then_close, "the server closed the connection before answering (1."),
                          (slow_then_cut, "answer cut short (the server closed after 25 bytes of its head) (1.")):
        with FakeLookupd(script) as fake:
            try:
                http_json(fake.address, "/topic/delete", {"topic": "t"}, method="POST", timeout=10)
            except LookupdError as e:
                assert words in str(e) and "HTTP port" not in str(e), e
            else:
                raise AssertionError("no error")


# -- refusals: bad input, grammar, a port mix-up (one line, the documented exit code) --------------------
import pytest  # noqa: E402
from tests.support.refusals import DEAD, bad_input, grammar_row, ids, port_mix_up  # noqa: E402

BAD_INPUT = [
    (["lookup", "--lookupd-http-address", DEAD], 1, r"no nsqlookupd answered \(127\.0\.0\.1:1\)"),
    (["lookup", "-t", "t", "--nodes"], 2, r"--topic and --nodes cannot be used together"),
    (["lookup", "a", "-t", "b"], 2, r"TOPIC given twice: 'a' as an argument and 'b' with -t \(give it once\)"),
    (["lookup", "bad topic"], 2, r"invalid topic name 'bad topic'"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["lookup", "a", "-t", "b"], 2, r"TOPIC given twice"),
    (["lookup", "x", "--timeout", "0"], 2, r"'--timeout': must be more than 0"),
    (["lookup", "--lookupd-http-address", DEAD], 1, r"127\.0\.0\.1:1"),  # an unreachable lookupd, said once
    (["lookup", "t", "--lookupd-http-address", DEAD], 1, r"127\.0\.0\.1:1"),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)


PORT_MIX_UPS = [  # {tcp}/{http}: the nsqd's ports
    (["lookup", "--lookupd-http-address", "{tcp}"],
     r"no nsqlookupd answered \({tcp}\) \(this port speaks TCP, not HTTP: give nsqlookupd's HTTP port"),
    (["lookup", "--lookupd-http-address", "{http}"], r"\(it answered 404 like an nsqd HTTP port: give nsqlookupd's"),
]


@pytest.mark.parametrize("args,pattern", PORT_MIX_UPS, ids=ids(PORT_MIX_UPS, width=50))
def test_a_port_mix_up_gets_the_hint(nsqd, lookupd, topic, args, pattern):
    port_mix_up(nsqd, lookupd, topic, args, pattern)
