"""NOT FIXED (not collected: the name does not start with test_). Run it by name:
    .venv/bin/pytest -q tests/cli/repro_peek_two_nsqd.py
tail --peek without -n over two nsqd with backlogs above --max-in-flight/2 (250 and 50, --max-in-flight
200: RDY 100 per node) shows 250 of 300 (B's 50 never looked at; exit 0, no word), or, by timing (seen
by hand at HEAD 6e5ae2b), stalls: node A holds 100 in flight, node B 50 (its whole
backlog), and nothing moves: _give_back_some counts room and unseen messages over all nodes, but the
room is on B (nothing left to send) while A is full, so nothing is given back and nsqd sends nothing.
Before f66fa2f the same peek ended at the first message come round again, showing 250 of 300 (B's 50
never looked at). Renamed test_... once fixed (pacing and the end per node: per (nsqd, topic) backlog)."""

from __future__ import annotations

from helpers import channel_stats, http_post, wait_for
from helpers import run_nsqcli as run
from hung import cluster  # noqa: F401 - the fixture


def test_peek_over_two_nsqd_with_backlogs_above_half_the_max_in_flight_shows_all(cluster, topic):
    a, b = cluster.nsqds[:2]
    for node, n in ((a, 250), (b, 50)):
        http_post(node.http_address, "/topic/create", topic=topic)
        http_post(node.http_address, "/channel/create", topic=topic, channel="billing")
        http_post(node.http_address, "/mpub", b"\n".join(b"%d" % i for i in range(n)), topic=topic)
        wait_for(lambda node=node, n=n: channel_stats(node, topic, "billing")["depth"] == n, what="backlog")
    env = {"NSQCLI_NSQD_TCP_ADDRESS": f"{a.tcp_address} {b.tcp_address}",
           "NSQCLI_NSQD_HTTP_ADDRESS": f"{a.http_address} {b.http_address}"}
    r = run(["tail", topic, "-c", "billing", "--peek", "--timeout", "10s"], env)
    assert r.returncode == 0, (r.returncode, r.stderr)  # exit 3 at the --timeout: stalled
    assert len(r.stdout.splitlines()) == 300, (len(r.stdout.splitlines()), r.stderr)
    for node, n in ((a, 250), (b, 50)):
        ch = channel_stats(node, topic, "billing")
        assert ch["depth"] + ch["in_flight_count"] + ch["deferred_count"] == n
