"""RDY moves when a connection runs dry (issue 32, part 4), on real nsqd: with fewer messages in
flight than nodes, a holder whose nsqd is empty hands its RDY on within a fraction of a second,
not after the idle timer (low_rdy_idle_timeout), so every node's messages are read at once."""

from __future__ import annotations

import time

from tests.support.helpers import Collector, channel_stats, http_post, run_nsqcli

from nsqcli import Config, Consumer

PER_NODE = 15


def publish_on_each(servers, topic, n=PER_NODE):
    for i, s in enumerate(servers):
        http_post(s.http_address, "/mpub", b"\n".join(b"node%d-%03d" % (i, j) for j in range(n)), topic=topic)


def ready_total(servers, topic, channel):
    total = 0
    for s in servers:
        ch = channel_stats(s, topic, channel) or {}
        total += sum(cl["ready_count"] for cl in ch.get("clients") or [])
    return total


def test_rdy_leaves_an_empty_nsqd_long_before_the_idle_timer(nsqd, extra_nsqd, topic):
    """4 nsqd, max_in_flight 2, an idle timer of 60 s: the first two holders run dry after 15
    messages each. Without the dry rule the other two nodes' 30 messages waited 60 s; now all
    60 arrive within a few seconds, from every node, never more than 2 RDY out."""
    servers = [nsqd, extra_nsqd(), extra_nsqd(), extra_nsqd()]
    publish_on_each(servers, topic)
    col = Collector(PER_NODE * len(servers))
    c = Consumer(topic, "c", col, nsqd_tcp_addresses=[s.tcp_address for s in servers],
                 config=Config(max_in_flight=2, low_rdy_idle_timeout=60.0, low_rdy_timeout=120.0,
                               rdy_redistribute_interval=5.0))
    c.start()
    try:
        deadline = time.monotonic() + 8.0  # the idle timer is 60 s
        while not col.done.is_set() and time.monotonic() < deadline:
            assert ready_total(servers, topic, "c") <= 2
            time.sleep(0.05)
        assert col.done.is_set(), f"{len(col.msgs)} of {col.want} read in 8 s"
    finally:
        c.stop()
    assert {m[2] for m in col.msgs} == {s.tcp_address for s in servers}
    assert sorted(col.bodies) == sorted(b"node%d-%03d" % (i, j) for i in range(4) for j in range(PER_NODE))


def test_bounded_tail_over_more_nodes_than_max_in_flight(sandbox, nsqd, extra_nsqd, lookupd, topic):
    """`nsqcli tail -n` through nsqlookupd over 4 nodes with --max-in-flight 2 (default idle
    timer, 10 s): every message within --timeout 6s (exit 3 if not), from all four nodes."""
    servers = [nsqd, extra_nsqd(), extra_nsqd(), extra_nsqd()]
    publish_on_each(servers, topic)
    want = PER_NODE * len(servers)
    r = run_nsqcli(["tail", topic, "-n", str(want), "--max-in-flight", "2", "--timeout", "6s",
                    "--drain-backlog", "--lookupd-http-address", lookupd.http_address], timeout=30)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.splitlines()
    assert sorted(lines) == sorted(b"node%d-%03d" % (i, j) for i in range(4) for j in range(PER_NODE))
