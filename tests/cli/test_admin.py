"""nsqcli topic/channel/node: every action checked in nsqd's /stats and nsqlookupd's answers,
on real nsqd nodes registered with a real nsqlookupd."""

from __future__ import annotations

import json
import time

import pytest
from tests.support.helpers import http_get_json, http_post, lookup_producers, one_error_line, run_nsqcli, topic_stats, wait_for
from tests.support.hung import cluster, stopped  # noqa: F401 - cluster: the fixture


def nsq(args, **env):
    return run_nsqcli(args, env or None, input=b"")


@pytest.fixture
def two_nodes(sandbox, extra_nsqd, topic):
    """The session nsqd and a second one, both carrying ``topic`` with channel 'c' (3 messages each)."""
    nodes = [sandbox.nsqd, extra_nsqd()]
    for n in nodes:
        http_post(n.http_address, "/topic/create", topic=topic)
        http_post(n.http_address, "/channel/create", topic=topic, channel="c")
        http_post(n.http_address, "/mpub", b"1\n2\n3", topic=topic)
    wait_for(lambda: len(lookup_producers(sandbox.lookupd, topic)) == 2,
             what="both nodes registered")
    return nodes


def chan(node, topic, name="c"):
    t = topic_stats(node, topic)
    return next((c for c in t["channels"] if c["channel_name"] == name), None) if t else None


def test_pause_unpause_and_empty_reach_every_node(sandbox, two_nodes, topic):
    lk = ["--lookupd-http-address", sandbox.lookupd.http_address]
    r = nsq(["channel", "pause", topic, "c", *lk])
    assert r.returncode == 0, r.stderr
    assert [chan(n, topic)["paused"] for n in two_nodes] == [True, True]
    assert len(r.stdout.decode().splitlines()) == 2 and r.stdout.startswith(b"ok   nsqd ")
    assert nsq(["channel", "unpause", topic, "c", *lk]).returncode == 0
    assert [chan(n, topic)["paused"] for n in two_nodes] == [False, False]
    assert nsq(["topic", "pause", topic, *lk]).returncode == 0
    assert [topic_stats(n, topic)["paused"] for n in two_nodes] == [True, True]
    assert nsq(["topic", "unpause", topic, *lk]).returncode == 0
    assert [topic_stats(n, topic)["paused"] for n in two_nodes] == [False, False]
    # empty is destructive: refused without --yes when nobody can be asked
    r = nsq(["channel", "empty", topic, "c", *lk])
    assert r.returncode == 2 and b"add --yes" in r.stderr and [chan(n, topic)["depth"] for n in two_nodes] == [3, 3]
    r = nsq(["channel", "empty", topic, "c", *lk, "--yes", "--json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and [s["ok"] for s in doc["steps"]] == [True, True]
    assert [chan(n, topic)["depth"] for n in two_nodes] == [0, 0]


def test_delete_through_lookupd_deletes_nodes_first_and_stays_deleted(sandbox, two_nodes, topic):
    lk = ["--lookupd-http-address", sandbox.lookupd.http_address]
    plan = json.loads(nsq(["topic", "delete", topic, *lk, "--dry-run", "--json"]).stdout)["steps"]
    assert [(s["kind"], s["path"]) for s in plan] == [("nsqd", "/topic/delete")] * 2 + [("nsqlookupd", "/topic/delete")]
    assert all(topic_stats(n, topic) for n in two_nodes)  # dry run changed nothing
    r = nsq(["topic", "delete", topic, *lk, "--yes"])
    assert r.returncode == 0, r.stderr
    assert [topic_stats(n, topic) for n in two_nodes] == [None, None]
    time.sleep(1.0)  # no node registers it again
    assert topic not in http_get_json(sandbox.lookupd.http_address, "/topics")["topics"]
    r = nsq(["lookup", topic, *lk])
    assert r.returncode == 1 and b"unknown" in r.stderr


def test_delete_that_fails_on_a_hung_nsqd_leaves_nsqlookupd_as_it_was(cluster, topic):
    """One of the two nsqd carrying the topic hangs (SIGSTOP): the delete goes through on the
    other, but nsqlookupd keeps the topic - else the hung node's messages would be found by no
    consumer once it answers again - exits 1 naming the node and how to finish. Run again once
    the node answers, it deletes everywhere."""
    a, b, _ = cluster.nsqds
    for n in (a, b):
        http_post(n.http_address, "/mpub", b"1\n2\n3", topic=topic)
        http_post(n.http_address, "/channel/create", topic=topic, channel="c")
    lookupd = cluster.lookupd.http_address
    wait_for(lambda: len(lookup_producers(cluster.lookupd, topic)) == 2, what="both nodes registered")
    with stopped(b):
        r = nsq(["topic", "delete", topic, "--lookupd-http-address", lookupd, "--yes", "--json"])
        assert topic_stats(a, topic) is None  # deleted where it could be
        wait_for(lambda: [p["http_port"] for p in lookup_producers(cluster.lookupd, topic)] == [
            int(b.http_address.rsplit(":", 1)[1])], what="only the hung node still registered")
    one_error_line(r, 1, rf"^nsqcli: error: delete failed on 1 of 2 node\(s\): http://{b.http_address}/info: "
                         rf"no complete answer within 5s .*; topic {topic} was left in nsqlookupd, so consumers still "
                         rf"find it on {b.http_address}: to finish, run this again once that node answers \(if it is "
                         rf"gone for good: nsqcli node tombstone {topic} {b.http_address} --lookupd-http-address "
                         rf"{lookupd} --yes\)$")
    steps = {(s["kind"], s["address"]): s for s in json.loads(r.stdout)["steps"]}
    assert len(steps) == 3 and steps[("nsqd", a.http_address)]["ok"] is True
    assert steps[("nsqd", b.http_address)]["ok"] is False and b.http_address in steps[("nsqd", b.http_address)]["error"]
    skipped = steps[("nsqlookupd", lookupd)]
    assert skipped["ok"] is None and skipped["skipped"] is True
    assert skipped["error"] == f"not run: the delete failed on nsqd {b.http_address}"
    assert topic in http_get_json(lookupd, "/topics")["topics"]
    assert chan(b, topic)["depth"] == 3  # the hung node kept its messages, still findable
    r = nsq(["topic", "delete", topic, "--lookupd-http-address", lookupd, "--yes"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == [f"ok   nsqd {b.http_address}: POST /topic/delete topic={topic}",
                                              f"ok   nsqlookupd {lookupd}: POST /topic/delete topic={topic}"]
    assert topic_stats(b, topic) is None
    time.sleep(1.0)  # no node registers it again
    assert topic not in http_get_json(lookupd, "/topics")["topics"] and lookup_producers(cluster.lookupd, topic) == []


def test_channel_delete_refused_by_a_node_skips_nsqlookupd(sandbox, two_nodes, topic):
    lookupd = sandbox.lookupd.http_address
    r = nsq(["channel", "delete", topic, "c", "--nsqd-http-address", two_nodes[0].http_address,
             "--nsqd-http-address", "127.0.0.1:1", "--lookupd-http-address", lookupd, "--yes"])
    lines = r.stdout.decode().splitlines()
    assert lines[0] == f"ok   nsqd {two_nodes[0].http_address}: POST /channel/delete topic={topic} channel=c"
    assert lines[1].startswith("FAIL nsqd 127.0.0.1:1: POST /channel/delete") and "unreachable" in lines[1]
    assert lines[2] == (f"SKIP nsqlookupd {lookupd}: POST /channel/delete topic={topic} channel=c  "
                        "not run: the delete failed on nsqd 127.0.0.1:1")
    one_error_line(r, 1, rf"delete failed on 1 of 2 node\(s\): .*; channel {topic}/c was left in nsqlookupd, so "
                         r"consumers still find it on 127.0.0.1:1: to finish, run this again once that node answers$")
    assert http_get_json(lookupd, "/channels", topic=topic)["channels"] == ["c"]
    assert chan(two_nodes[1], topic) is not None


def test_create_on_given_nodes_and_a_failing_node(nsqd, topic):
    r = nsq(["topic", "create", topic, "--nsqd-http-address", nsqd.http_address])
    assert r.returncode == 0 and topic_stats(nsqd, topic)["channels"] == []
    assert nsq(["channel", "create", topic, "archive", "--nsqd-http-address", nsqd.http_address]).returncode == 0
    assert chan(nsqd, topic, "archive") is not None
    r = nsq(["channel", "delete", topic, "archive", "--yes", "--nsqd-http-address", nsqd.http_address,
             "--nsqd-http-address", "127.0.0.1:1"])
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 1 and lines[0].startswith(f"ok   nsqd {nsqd.http_address}: POST /channel/delete")
    assert lines[1].startswith("FAIL nsqd 127.0.0.1:1: POST /channel/delete") and "unreachable" in lines[1]
    assert r.stderr.decode().startswith("nsqcli: error: delete failed on 1 of 2 node(s): ")
    assert chan(nsqd, topic, "archive") is None
    r = nsq(["channel", "delete", topic, "nope", "--yes", "--nsqd-http-address", nsqd.http_address])
    assert r.returncode == 1 and b"CHANNEL_NOT_FOUND" in r.stdout


def test_tombstone_a_producer_in_lookupd(sandbox, two_nodes, topic):
    lk = ["--lookupd-http-address", sandbox.lookupd.http_address]
    second = two_nodes[1]
    r = nsq(["node", "tombstone", topic, second.tcp_address, *lk, "--yes"])
    assert r.returncode == 0, r.stderr
    producers = http_get_json(sandbox.lookupd.http_address, "/lookup", topic=topic)["producers"]
    assert [p["tcp_port"] for p in producers] == [int(sandbox.nsqd.tcp_address.rsplit(":", 1)[1])]
    r = nsq(["node", "tombstone", topic, "127.0.0.1:9", *lk, "--yes"])
    assert r.returncode == 2 and b"node '127.0.0.1:9' is not registered with nsqlookupd" in r.stderr


def test_create_through_lookupd_registers_the_topic(sandbox, topic):
    r = nsq(["topic", "create", topic, "--lookupd-http-address", sandbox.lookupd.http_address])
    assert r.returncode == 0, r.stderr
    assert topic in http_get_json(sandbox.lookupd.http_address, "/topics")["topics"]
    r = nsq(["channel", "create", topic, "ch", "--lookupd-http-address", sandbox.lookupd.http_address])
    assert r.returncode == 0 and http_get_json(sandbox.lookupd.http_address, "/channels", topic=topic)["channels"] == ["ch"]


def answer_on_tty(argv, answer: bytes) -> tuple[int, str]:
    """nsqcli ``argv`` on a terminal (stdin and stderr a pty): ``answer`` typed at its [y/N] prompt;
    (exit code, what the terminal showed)."""
    import os
    import pty
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env

    master, slave = pty.openpty()
    p = subprocess.Popen(NSQCLI + list(argv), stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=clean_env())
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 20
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 4096)
    os.write(master, answer + b"\n")
    p.wait(timeout=20)
    try:
        while chunk := os.read(master, 4096):
            seen += chunk
    except OSError:
        pass
    os.close(master)
    return p.returncode, seen.decode(errors="replace")


def test_destructive_actions_ask_on_a_terminal(nsqd, topic):
    """On a TTY delete lists the calls and asks; 'n' changes nothing, 'y' deletes."""
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    argv = ["topic", "delete", topic, "--nsqd-http-address", nsqd.http_address]
    code, screen = answer_on_tty(argv, b"n")
    assert code == 1 and f"nsqd {nsqd.http_address}: POST /topic/delete topic={topic}" in screen  # declined: exit 1
    assert "Delete (with every message in it) topic" in screen and topic_stats(nsqd, topic) is not None
    code, screen = answer_on_tty(argv, b"y")
    assert code == 0 and topic_stats(nsqd, topic) is None


def test_channel_create_before_its_topic_says_to_create_the_topic_first(sandbox, topic):
    """nsqlookupd registers the channel, nsqd answers 404 TOPIC_NOT_FOUND: the line says why and
    what to run; after `topic create` the same command works."""
    lk = ["--nsqd-http-address", sandbox.nsqd.http_address, "--lookupd-http-address", sandbox.lookupd.http_address]
    one_error_line(nsq(["channel", "create", topic, "billing", *lk]), 1,
                   rf"HTTP 404 TOPIC_NOT_FOUND; topic {topic} does not exist on that nsqd yet: create it first "
                   rf"\(nsqcli topic create {topic}\), then run this again \(nsqlookupd .* already lists the channel\)")
    assert nsq(["topic", "create", topic, *lk]).returncode == 0
    assert nsq(["channel", "create", topic, "billing", *lk]).returncode == 0
    assert chan(sandbox.nsqd, topic, "billing") is not None


# -- refusals: bad input, footguns, grammar, a port mix-up (one line, the documented exit code) ---------
from tests.support.helpers import channel_stats  # noqa: E402
from tests.support.refusals import DEAD, address_footgun, bad_input, grammar_row, ids, port_mix_up  # noqa: E402

BAD_INPUT = [
    (["topic", "delete", "t", "--nsqd-http-address", DEAD], 2, r"delete is destructive: add --yes"),
    (["topic", "frob", "t"], 2, r"No such command 'frob'"),
    (["channel", "create", "t"], 2, r"missing CHANNEL \(nsqcli channel create TOPIC \[CHANNEL\], or -c CHANNEL\)"),
    (["node", "tombstone", "t", "h:1"], 2, r"tombstoning is done in nsqlookupd: give --lookupd-http-address"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["topic", "create", "a", "-t", "b"], 2, r"TOPIC given twice"),
    (["channel", "create", "a", "c", "-t", "b"], 2, r"TOPIC given twice"),
    (["channel", "delete", "a", "c", "-c", "d"], 2, r"CHANNEL given twice"),
    (["topic", "create"], 2, r"missing TOPIC \(nsqcli topic create TOPIC, or -t TOPIC\)"),
    (["channel", "create", "t"], 2, r"missing CHANNEL \(nsqcli channel create TOPIC \[CHANNEL\], or -c CHANNEL\)"),
    (["node", "tombstone", "t"], 2, r"missing NODE"),
    (["node", "tombstone", "-t", "t", "n1", "n2"], 2, r"too many arguments: 'n1 n2'"),
    (["topic", "pause", "x", "--timeout", "0"], 2, r"'--timeout': must be more than 0"),
    (["topic", "create", "t", "--lookupd-http-address", DEAD], 1, r"127\.0\.0\.1:1"),  # an unreachable lookupd, said once
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)


ADDRESS_FOOTGUNS = [
    ({}, ["topic", "create", "{t}", "--nsqd-http-address", "nsqd://{http}"], r"drop the scheme: {http}"),
    ({}, ["topic", "create", "{t}", "--nsqd-http-address", "http://{http}/stats"],
     r"a path is not used .*give http://{http}"),
]


@pytest.mark.parametrize("env,args,pattern", ADDRESS_FOOTGUNS, ids=ids(ADDRESS_FOOTGUNS, at=1, width=50))
def test_address_footgun_is_refused_naming_the_fix(nsqd, topic, env, args, pattern):
    address_footgun(nsqd, topic, env, args, pattern)


PORT_MIX_UPS = [  # {tcp}/{http}: the nsqd's ports
    (["topic", "create", "{t}", "--nsqd-http-address", "{tcp}"],
     r"create failed on 1 of 1 node\(s\): .*\(this port speaks TCP, not HTTP: give nsqd's HTTP port, usually 4151\)"),
    (["channel", "create", "{t}", "c", "--lookupd-http-address", "{tcp}"],
     r"no nsqlookupd answered .*\(this port speaks TCP, not HTTP: give nsqlookupd's HTTP port, usually 4161\)"),
    (["topic", "delete", "{t}", "--yes", "--lookupd-http-address", "{http}"],
     r"no nsqlookupd answered .*HTTP 404.* \(it answered 404 like an nsqd HTTP port: give nsqlookupd's HTTP port"),
    (["node", "tombstone", "{t}", "{tcp}", "--yes", "--lookupd-http-address", "{tcp}"],
     r"this port speaks TCP, not HTTP: give nsqlookupd's HTTP port"),
]


@pytest.mark.parametrize("args,pattern", PORT_MIX_UPS, ids=ids(PORT_MIX_UPS, width=50))
def test_a_port_mix_up_gets_the_hint(nsqd, lookupd, topic, args, pattern):
    port_mix_up(nsqd, lookupd, topic, args, pattern)


def test_http_urls_stay_accepted(nsqd, topic):
    """http(s):// is documented for HTTP addresses (https is the only way to reach a lookupd
    behind TLS): only a path, which would be dropped, is refused."""
    r = run_nsqcli(["topic", "create", topic, "--nsqd-http-address", f"http://{nsqd.http_address}/"])
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, topic) is not None


# -- a declined confirmation exits 1 and changes nothing ------------------------------------------------

@pytest.mark.parametrize("argv", [["topic", "delete", "{t}"], ["channel", "empty", "{t}", "ch"]])
def test_declined_confirmation_exits_1_and_changes_nothing(argv, nsqd, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="ch")
    http_post(nsqd.http_address, "/pub", b"y", topic=topic)
    code, screen = answer_on_tty([a.format(t=topic) for a in argv] + ["--nsqd-http-address", nsqd.http_address], b"n")
    assert code == 1, screen
    assert "nsqcli: error: not confirmed" in screen and "Traceback" not in screen
    assert topic_stats(nsqd, topic) is not None and channel_stats(nsqd, topic, "ch")["depth"] == 1


# -- the port hints say nothing of a port when the port is right (bugs an adversarial review found) ----

@pytest.mark.parametrize("action", [["channel", "delete"], ["channel", "empty"], ["topic", "pause"]])
def test_a_missing_topic_or_channel_is_not_called_a_wrong_port(action, nsqd, topic):
    """nsqd answers 404 TOPIC_NOT_FOUND / CHANNEL_NOT_FOUND for a topic or channel it does not
    have (a typo); port_hint matches any "HTTP 404" and tells the user the RIGHT port is wrong:
    "(it answered 404 like nsqlookupd HTTP port: give nsqd's HTTP port, usually 4151)"."""
    from tests.support.helpers import http_post, run_nsqcli

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
    from tests.support.helpers import http_post, run_nsqcli

    try:
        r = run_nsqcli(["topic", "create", topic, "--nsqd-http-address", lookupd.http_address])
        assert topic_stats(nsqd, topic) is None
        assert r.returncode != 0, r.stdout.decode() + r.stderr.decode()
    finally:
        http_post(lookupd.http_address, "/topic/delete", topic=topic)
