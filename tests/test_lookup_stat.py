"""`nsqcli lookup` and `nsqcli stat` against several real nsqd and nsqlookupd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from rich.console import Console

from helpers import http_get_json, http_post, wait_for
from nsqcli import Config, Consumer
from nsqcli.sandbox import NsqdOptions

NSQCLI = [sys.executable, "-m", "nsqcli"]


def run(args, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQCLI_")}
    return subprocess.run(NSQCLI + args, capture_output=True, timeout=timeout, env=env)


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


def snapshots(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


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


def test_dashboard_renders_to_a_capture_console():
    from nsqcli.cli.views import dashboard
    from nsqcli.client.stats import Sample, compute_rows

    def stats(depth, msgs, fin):
        return {"topics": [{"topic_name": "orders", "depth": depth, "backend_depth": 5, "message_count": msgs,
                            "paused": False, "channels": [{
                                "channel_name": "billing", "depth": depth, "backend_depth": 5,
                                "in_flight_count": 9, "deferred_count": 1, "message_count": msgs,
                                "requeue_count": 0, "timeout_count": 0, "client_count": 1, "paused": False,
                                "clients": [{"remote_address": "127.0.0.1:5555", "client_id": "w1", "connect_ts": 1,
                                             "user_agent": "nsqcli/0.1.0", "ready_count": 10,
                                             "in_flight_count": 9, "finish_count": fin, "requeue_count": 0}]}]}]}

    history = {}
    s1 = Sample({"n1": 0.0}, {"n1": stats(100, 1000, 10)}, {})
    compute_rows(None, s1, history=history)
    s2 = Sample({"n1": 2.0}, {"n1": stats(60, 1100, 150)}, {"n2": "unreachable"})
    (row,) = compute_rows(s1, s2, history=history)
    assert (row.ingress, row.egress) == (50.0, 70.0)  # per measured second
    assert row.drain_seconds() == 3.0 and "spilling to disk" in row.warnings()
    assert "consumers saturated" in row.warnings()
    console = Console(record=True, width=220, force_terminal=False)
    console.print(dashboard([row], s2, clients=True))
    text = console.export_text()
    assert "orders/billing" in text and "spilling to disk" in text and "down: n2" in text
    assert "127.0.0.1:5555" in text and "nsqcli/0.1.0" in text and "3s" in text
    assert row.sparkline() == "█▅"


def test_tail_and_to_file_live_tables_render(nsqd, topic, tmp_path):
    from nsqcli.archive.archiver import Archiver
    from nsqcli.cli.views import archive_table, connections_table
    from nsqcli.archive.writer import FileOptions

    http_post(nsqd.http_address, "/mpub", b"a\nb\nc", topic=topic)
    a = Archiver(topics=[topic], topic_pattern=None, topic_refresh=60, channel="c",
                 opts=FileOptions(output_dir=str(tmp_path)), formatter=lambda m: m.body + b"\n",
                 config=Config(max_in_flight=10), nsqd=[nsqd.tcp_address], lookupd=[], sync_interval=0.1)
    a.start()
    try:
        wait_for(lambda: a.status()[0]["finished"] == 3, what="archived")
        console = Console(record=True, width=200)
        console.print(archive_table(a, 200))
        console.print(connections_table([t.consumer for t in a.topics.values()], 200))
        text = console.export_text()
        assert topic in text and nsqd.tcp_address in text and "connected" in text
        assert os.path.basename(a.status()[0]["file"]) in text
    finally:
        a.stop()
