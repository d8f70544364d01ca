"""nsqcli topic/channel/node: every action checked in nsqd's /stats and nsqlookupd's answers,
on real nsqd nodes registered with a real nsqlookupd."""

from __future__ import annotations

import json
import time

import pytest
from helpers import http_get_json, http_post, lookup_producers, run_nsqcli, topic_stats, wait_for


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


def test_destructive_actions_ask_on_a_terminal(nsqd, topic):
    """On a TTY delete lists the calls and asks; 'n' changes nothing, 'y' deletes."""
    import os
    import pty
    import subprocess

    from helpers import NSQCLI, clean_env

    http_post(nsqd.http_address, "/pub", b"x", topic=topic)

    def run_on_tty(answer: bytes) -> tuple[int, str]:
        master, slave = pty.openpty()
        p = subprocess.Popen(NSQCLI + ["topic", "delete", topic, "--nsqd-http-address", nsqd.http_address],
                             stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=clean_env())
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 20
        while b"[y/N]" not in seen and time.monotonic() < deadline:
            seen += os.read(master, 4096)
        os.write(master, answer + b"\n")
        p.wait(timeout=20)
        try:
            while True:
                chunk = os.read(master, 4096)
                if not chunk:
                    break
                seen += chunk
        except OSError:
            pass
        os.close(master)
        return p.returncode, seen.decode(errors="replace")

    code, screen = run_on_tty(b"n")
    assert code == 1 and f"nsqd {nsqd.http_address}: POST /topic/delete topic={topic}" in screen  # declined: exit 1
    assert "Delete (with every message in it) topic" in screen and topic_stats(nsqd, topic) is not None
    code, screen = run_on_tty(b"y")
    assert code == 0 and topic_stats(nsqd, topic) is None
