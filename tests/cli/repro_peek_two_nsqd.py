"""NOT FIXED (not collected: the name does not start with test_). Run it by name:
    .venv/bin/pytest -q tests/cli/repro_peek_two_nsqd.py
tail --peek without -n over two nsqd with backlogs above --max-in-flight/2 (250 and 50, --max-in-flight
200: RDY 100 per node) shows 250 of 300 (B's 50 never looked at; exit 0, no word), or, by timing (seen
by hand at HEAD 6e5ae2b), stalls: node A holds 100 in flight, node B 50 (its whole
backlog), and nothing moves: _give_back_some counts room and unseen messages over all nodes, but the
room is on B (nothing left to send) while A is full, so nothing is given back and nsqd sends nothing.
Before f66fa2f the same peek ended at the first message come round again, showing 250 of 300 (B's 50
never looked at). Renamed test_... once fixed (pacing and the end per node: per (nsqd, topic) backlog).

The same cause with -n: 8 and 2 waiting, --peek -n 10 splits RDY 5/5; the first node holds its 5
shown (held to the end under -n) and cannot send its other 3: 7 of 10 shown, then --timeout (a
clean-clone CI run on a busy machine, 11:40; it passes when RDY moves in time)."""

from __future__ import annotations

from helpers import channel_stats, http_post, wait_for
from helpers import run_nsqcli as run
from hung import cluster  # noqa: F401 - the fixture
from test_tail_peek import _backlog, _waiting


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


def test_peek_over_two_nsqd_with_uneven_backlogs(cluster, topic):
    """8 messages on one node, 2 on the other: -n 10 (ten in flight at most) shows all ten and
    leaves both channels as they were."""
    a, b = cluster.nsqds[:2]
    for node, n in ((a, 8), (b, 2)):
        _backlog(node, topic, "billing", [b"%s-%d" % (node.tcp_address.encode(), i) for i in range(n)])
    env = {"NSQCLI_NSQD_TCP_ADDRESS": f"{a.tcp_address} {b.tcp_address}",
           "NSQCLI_NSQD_HTTP_ADDRESS": f"{a.http_address} {b.http_address}"}
    r = run(["tail", topic, "-c", "billing", "--peek", "-n", "10", "--timeout", "20s"], env)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 10 and len(set(r.stdout.splitlines())) == 10
    assert _waiting(channel_stats(a, topic, "billing")) == 8 and _waiting(channel_stats(b, topic, "billing")) == 2
    assert channel_stats(a, topic, "billing")["requeue_count"] == 8
