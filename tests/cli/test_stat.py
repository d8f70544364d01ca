"""`nsqcli stat` against real nsqd/nsqlookupd."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from helpers import NSQCLI, http_post, lookup_producers, run_nsqcli, wait_for
from helpers import run_nsqcli as run

from nsqcli import Config, Consumer


def snapshots(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_stat_uses_nsqd_and_lookupd_addresses_together(sandbox, extra_nsqd, topic):
    second = extra_nsqd()
    for node in (sandbox.nsqd, second):
        http_post(node.http_address, "/pub", b"x", topic=topic)
    wait_for(lambda: len(lookup_producers(sandbox.lookupd, topic)) == 2,
             what="both nodes registered")
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--no-live", "--per-node", "--nsqd-http-address",
                    sandbox.nsqd.http_address, "--lookupd-http-address", sandbox.lookupd.http_address])
    rows = [ln for ln in r.stdout.decode().splitlines()[2:]]
    assert r.returncode == 0 and len(rows) == 2 and {ln.split()[0].split("@")[1] for ln in rows} == {
        sandbox.nsqd.http_address, second.http_address}


def test_stat_bad_address_is_a_usage_error():
    r = run(["stat", "--nsqd-http-address", ":"])
    assert r.returncode == 2 and b"invalid address ':'" in r.stderr and b"Traceback" not in r.stderr


def test_stat_into_head_exits_0(nsqd):
    p = subprocess.Popen(NSQCLI + ["stat", "--nsqd-http-address", nsqd.http_address, "--interval", "0.1s"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    _, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    assert b"Traceback" not in err and b"Exception ignored" not in err


def test_stat_numbers_match_what_happened(nsqd, extra_nsqd, topic):
    other = extra_nsqd()
    nodes = [nsqd, other]
    for s in nodes:
        http_post(s.http_address, "/topic/create", topic=topic)
        http_post(s.http_address, "/channel/create", topic=topic, channel="c")
        http_post(s.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(5)), topic=topic)
    http_post(nsqd.http_address, "/pub", b"later", topic=topic, defer="60000")  # DPUB
    handled = []
    lock = threading.Lock()

    def handler(m):
        with lock:
            handled.append(m)
            n = len(handled)
        if n <= 6:
            m.finish()
        elif n <= 8:
            m.requeue(delay=60, backoff=False)  # becomes deferred
        else:
            m.disable_auto_response()  # held in flight

    c = Consumer(topic, "c", handler, nsqd_tcp_addresses=[s.tcp_address for s in nodes],
                 config=Config(max_in_flight=10, max_backoff_duration=0))
    c.start()
    try:
        wait_for(lambda: len(handled) == 10, what="10 handled")
        time.sleep(0.3)
        r = run(["stat", "-t", topic, "-c", "c", "--json", "--count", "1", "--interval", "0.3s",
                 "--nsqd-http-address", nsqd.http_address, "--nsqd-http-address", other.http_address])
        assert r.returncode == 0, r.stderr
        (snap,) = snapshots(r.stdout)
        (row,) = snap["rows"]
        assert (row["topic"], row["channel"], row["node"], row["nodes"]) == (topic, "c", "*", 2)
        assert row["depth"] == 0 and row["in_flight"] == 2 and row["requeued"] == 2
        assert row["deferred"] == 3  # 2 requeued with a delay + 1 DPUB
        assert row["clients"] == 2 and row["timed_out"] == 0
        assert row["messages"] == 11  # 10 published + 1 deferred publish reaching the channel
        assert row["egress_per_s"] == 0 and row["ingress_per_s"] == 0
        expected = {"node", "topic", "channel", "depth", "mem", "disk", "in_flight", "deferred", "requeued",
                    "timed_out", "messages", "clients", "ready", "paused", "nodes", "ingress_per_s",
                    "egress_per_s", "requeue_per_s", "timeout_per_s", "drain_seconds", "warnings"}
        assert expected <= set(row)
        r = run(["stat", "-t", topic, "-c", "c", "--json", "--count", "1", "--interval", "0.3s", "--per-node",
                 "--nsqd-http-address", nsqd.http_address, "--nsqd-http-address", other.http_address])
        rows = snapshots(r.stdout)[0]["rows"]
        assert sorted(x["node"] for x in rows) == sorted([nsqd.http_address, other.http_address])
        assert sum(x["in_flight"] for x in rows) == 2
    finally:
        c.stop(timeout=2)


def test_stat_rates_and_egress_never_negative(nsqd, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="c")
    p = subprocess.Popen(NSQCLI + ["stat", "-t", topic, "--json", "--count", "6", "--interval", "0.4s",
                                   "--nsqd-http-address", nsqd.http_address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()  # the baseline has been taken
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(400)), topic=topic)
    got = []

    def slow(m):
        time.sleep(0.002)
        got.append(1)

    c = Consumer(topic, "c", slow, nsqd_tcp_addresses=[nsqd.tcp_address], config=Config(max_in_flight=20))
    c.start()
    wait_for(lambda: len(got) >= 200, what="half consumed")
    c.stop()  # the consumer leaves mid-run: its finish_count disappears from /stats
    c = Consumer(topic, "c", slow, nsqd_tcp_addresses=[nsqd.tcp_address], config=Config(max_in_flight=20))
    c.start()
    out, err = p.communicate(timeout=30)
    c.stop()
    assert p.returncode == 0, err
    rows = [s["rows"][0] for s in snapshots(first + out) if s["rows"]]
    assert len(rows) == 6
    assert all(r["egress_per_s"] >= 0 and r["ingress_per_s"] >= 0 for r in rows)
    assert max(r["egress_per_s"] for r in rows) > 50
    # rates integrate to what really happened (measured elapsed time, not the nominal interval)
    assert sum(r["ingress_per_s"] for r in rows) * 0.4 > 300


def test_stat_node_killed_mid_run_shows_down_and_goes_on(nsqd, extra_nsqd, topic):
    victim = extra_nsqd()
    for s in (nsqd, victim):
        http_post(s.http_address, "/pub", b"x", topic=topic)
    p = subprocess.Popen(NSQCLI + ["stat", "-t", topic, "--json", "--count", "5", "--interval", "0.4s",
                                   "--nsqd-http-address", nsqd.http_address,
                                   "--nsqd-http-address", victim.http_address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()
    victim.kill()
    rest, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    snaps = snapshots(first + rest)
    assert len(snaps) == 5
    assert snaps[0]["nodes_down"] == {} and snaps[-1]["nodes_up"] == [nsqd.http_address]
    assert victim.http_address in snaps[-1]["nodes_down"]
    assert snaps[-1]["rows"][0]["nodes"] == 1
    assert f"nsqd {victim.http_address} is down".encode() in err


def test_stat_plain_lines_like_nsq_stat(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="c")
    r = run(["stat", "-t", topic, "-c", "c", "--count", "2", "--interval", "0.2s",
             "--nsqd-http-address", nsqd.http_address])
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("------rate------+") and lines[1].startswith("ingress  egress |")
    # the message published before the channel existed waits in it: depth 1, 1 message
    assert len(lines) == 4 and lines[2].split("|")[1].split()[0] == "1" and lines[3].split()[-2] == "1"
