"""`nsqcli stat` against real nsqd/nsqlookupd."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from tests.support.helpers import NSQCLI, channel_stats, http_post, lookup_producers, run_nsqcli, wait_for
from tests.support.inprocess import run_in_process
from tests.support.helpers import run_nsqcli as run
from tests.support.hung import cluster, stopped  # noqa: F401 - cluster: the fixture

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


def test_a_lookupd_that_fails_is_said_once_and_the_rest_polled(nsqd, topic):
    """stat's lookup runs on a thread of its own (a signal must not land in it): its warning is
    still said, once, by the command, and the nsqd given is still polled."""
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    r = run_nsqcli(["stat", "-t", topic, "-n", "2", "--interval", "0.2s", "--no-live", "--nsqd-http-address",
                    nsqd.http_address, "--lookupd-http-address", "127.0.0.1:1"])
    err = r.stderr.decode()
    assert r.returncode == 0 and err.count("nsqlookupd failed: http://127.0.0.1:1") == 1, err
    assert topic in r.stdout.decode()


def test_stat_bad_address_is_a_usage_error():
    r = run_in_process(["stat", "--nsqd-http-address", ":"])
    assert r.returncode == 2 and b"invalid address ':'" in r.stderr and b"Traceback" not in r.stderr


def test_stat_into_head_exits_0(nsqd, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)  # a row to print (an empty nsqd prints none)
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

        def settled():  # nsqd has the 6 FINs and the 2 REQs: 2 in flight, 3 deferred (+ the DPUB)
            chans = [channel_stats(s, topic, "c") for s in nodes]
            return (sum(ch["in_flight_count"] for ch in chans), sum(ch["deferred_count"] for ch in chans),
                    sum(ch["requeue_count"] for ch in chans)) == (2, 3, 2)

        wait_for(settled, what="the handler's answers seen by nsqd")
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
    # rates over the time measured between nsqd's answers, not the nominal 0.4 s interval: the
    # time a rate implies (new messages / rate) is more than 0.4 s (the request's own time is in
    # it) and about the time between the two snapshots
    docs = [s for s in snapshots(first + out) if s["rows"]]
    rose = [(before, d) for before, d in zip(docs, docs[1:]) if d["rows"][0]["messages"] > before["rows"][0]["messages"]]
    assert rose, docs  # the 400 published arrived within the run
    for before, d in rose:
        new, rate = d["rows"][0]["messages"] - before["rows"][0]["messages"], d["rows"][0]["ingress_per_s"]
        assert rate > 0 and 0.4 + 1e-4 < new / rate < d["time"] - before["time"] + 1.0, (new, rate, before, d)


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


def test_stat_hung_nodes_cost_one_deadline_and_are_named(cluster, topic):
    """Two of three nsqd hang (SIGSTOP): every node is asked at once, so the first report comes
    one deadline after the start (not one per hung node and round), the hung ones are named as
    down, and the reports after it keep the --interval."""
    healthy, *hung = cluster.nsqds
    for node in cluster.nsqds:
        http_post(node.http_address, "/pub", b"x", topic=topic)
    wait_for(lambda: len(lookup_producers(cluster.lookupd, topic)) == 3, what="three nodes registered")
    deadline, interval = 2.0, 0.5
    with stopped(*hung):
        t0 = time.monotonic()
        r = run(["stat", "-t", topic, "--json", "-n", "2", "--interval", f"{interval}s",
                 "--http-client-request-timeout", f"{deadline}s",
                 "--lookupd-http-address", cluster.lookupd.http_address], timeout=60)
        took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    snaps = snapshots(r.stdout)
    # baseline (one deadline) + 2 intervals; one by one it would be 3 rounds x 2 deadlines
    assert took < 2 * deadline + 2 * interval + 1.5, took
    assert snaps[1]["time"] - snaps[0]["time"] < interval + deadline / 2  # the hung nodes hold no refresh
    for snap in snaps:
        assert snap["nodes_up"] == [healthy.http_address]
        assert sorted(snap["nodes_down"]) == sorted(n.http_address for n in hung)
        assert snap["rows"][0]["nodes"] == 1
    err = r.stderr.decode()
    for node in hung:
        assert f"nsqcli: warning: nsqd {node.http_address} is down: " in err
        assert f"no complete answer within {deadline:g}s" in snaps[0]["nodes_down"][node.http_address]
    assert len(err.splitlines()) == 2 and "Traceback" not in err  # one line per hung node, said once


def test_stat_reports_a_hung_node_again_once_it_answers(cluster, topic):
    """A node hung at the start is asked again in the background while the others are reported:
    once it answers (SIGCONT) it is back in the reports, with its rows."""
    healthy, back, _ = cluster.nsqds
    for node in (healthy, back):
        http_post(node.http_address, "/pub", b"x", topic=topic)
    args = ["stat", "-t", topic, "--json", "-n", "8", "--interval", "0.3s", "--http-client-request-timeout", "1s",
            "--nsqd-http-address", healthy.http_address, "--nsqd-http-address", back.http_address]
    with stopped(back):
        p = subprocess.Popen(NSQCLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = p.stdout.readline()
    rest, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    snaps = snapshots(first + rest)
    assert snaps[0]["nodes_up"] == [healthy.http_address] and list(snaps[0]["nodes_down"]) == [back.http_address]
    assert snaps[-1]["nodes_up"] == sorted([healthy.http_address, back.http_address])
    assert snaps[-1]["nodes_down"] == {} and snaps[-1]["rows"][0]["nodes"] == 2


# -- refusals: bad input, footguns, grammar, a port mix-up (one line, the documented exit code) ----------
import re  # noqa: E402

import pytest  # noqa: E402
from tests.support.refusals import (DEAD, address_footgun, argv_footgun, bad_input, grammar_row, ids, port_mix_up,  # noqa: E402
                      refused, untouched)

BAD_INPUT = [
    (["stat", "-c", "x"], 2, r"--channel needs --topic"),
    (["stat", "--interval", "x"], 2, r"'--interval': 'x' is not a duration"),
    (["stat", "--interval", "0"], 2, r"'--interval': must be more than 0"),
    (["stat", "-n", "0"], 2, r"'-n' / '--count': 0 is not in the range x>=1"),
    (["stat", "--nsqd-http-address", ":"], 2, r"'--nsqd-http-address': invalid address ':'"),
    (["stat", "--nsqd-http-address", DEAD, "-n", "1", "--no-live", "--interval", "0.2s"], 1,
     r"no nsqd answered /stats: 127\.0\.0\.1:1"),  # --interval: the report waits one (2 s by default)
    (["stat", "--json", "--live"], 2, r"--json and --live cannot be used together"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["stat", "a", "-t", "b"], 2, r"TOPIC given twice: 'a' as an argument and 'b' with -t \(give it once\)"),
    (["stat", "a", "x", "-t", "a", "-c", "y"], 2, r"CHANNEL given twice: 'x' as an argument and 'y' with -c"),
    (["stat", "a", "b", "c"], 2, r"too many arguments: 'c'"),
    (["stat", "--timeout", "0"], 2, r"'--timeout': must be more than 0"),
    (["stat", "-n", "1", "--lookupd-http-address", DEAD], 1, r"127\.0\.0\.1:1"),  # an unreachable lookupd, said once
    (["stat", "t", "-n", "1", "--lookupd-http-address", DEAD], 1, r"127\.0\.0\.1:1"),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)


ARGV_FOOTGUNS = [
    (["stat", "-topic", "{t}"], r"'-topic' is not an option: use --topic"),
]


@pytest.mark.parametrize("args,pattern", ARGV_FOOTGUNS, ids=ids(ARGV_FOOTGUNS, width=50))
def test_argv_footgun_is_refused_before_acting(nsqd, topic, args, pattern):
    argv_footgun(nsqd, topic, args, pattern)


ADDRESS_FOOTGUNS = [
    ({}, ["stat", "-t", "{t}", "--nsqd-http-address", "tcp://{http}", "-n", "1"], r"drop the scheme: {http}"),
]


@pytest.mark.parametrize("env,args,pattern", ADDRESS_FOOTGUNS, ids=ids(ADDRESS_FOOTGUNS, at=1, width=50))
def test_address_footgun_is_refused_naming_the_fix(nsqd, topic, env, args, pattern):
    address_footgun(nsqd, topic, env, args, pattern)


PORT_MIX_UPS = [  # {tcp}/{http}: the nsqd's ports, {lhttp}: nsqlookupd's HTTP port (--interval: see BAD_INPUT)
    (["stat", "-n", "1", "--no-live", "--interval", "0.2s", "--nsqd-http-address", "{tcp}"],
     r"no nsqd answered /stats: {tcp} \(this port speaks TCP, not HTTP: give nsqd's HTTP port, usually 4151\)"),
    (["stat", "-n", "1", "--no-live", "--interval", "0.2s", "--nsqd-http-address", "{lhttp}"],
     r"\(it answered 404 like nsqlookupd HTTP port: give nsqd's HTTP port, usually 4151\)"),
    (["stat", "-n", "1", "--no-live", "--lookupd-http-address", "{tcp}"],
     r"no nsqlookupd answered \({tcp}\) \(this port speaks TCP, not HTTP: give nsqlookupd's HTTP port, usually 4161\)"),
    (["stat", "-n", "1", "--no-live", "--lookupd-http-address", "{http}"],
     r"\(it answered 404 like an nsqd HTTP port: give nsqlookupd's HTTP port, usually 4161\)"),
]


@pytest.mark.parametrize("args,pattern", PORT_MIX_UPS, ids=ids(PORT_MIX_UPS, width=50))
def test_a_port_mix_up_gets_the_hint(nsqd, lookupd, topic, args, pattern):
    port_mix_up(nsqd, lookupd, topic, args, pattern)


def test_stat_of_a_topic_that_exists_nowhere_says_so(nsqd, lookupd, topic):
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--no-live", "--nsqd-http-address", nsqd.http_address])
    refused(r, 1, rf"topic '{topic}' exists on no nsqd \(asked {re.escape(nsqd.http_address)}\)")
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--json", "--lookupd-http-address", lookupd.http_address])
    refused(r, 1, rf"topic '{topic}' is unknown to nsqlookupd {re.escape(lookupd.http_address)}")
    untouched(nsqd, topic)


def test_stat_timeout_before_count_exits_3(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    r = run_nsqcli(["stat", topic, "-n", "3", "--interval", "0.5s", "--timeout", "1s", "--json",
                    "--nsqd-http-address", nsqd.http_address])
    refused(r, 3, r"--timeout passed after [0-2] of 3 reports", stdout_empty=False)
    r = run_nsqcli(["stat", topic, "--interval", "0.2s", "--timeout", "3s", "--json",
                    "--nsqd-http-address", nsqd.http_address])  # no count: the deadline ends the run
    # (3 s: counted from process start, 1 s had room for one report only on a loaded CI machine)
    assert r.returncode == 0 and r.stdout.count(b"\n") >= 2 and r.stderr == b"", r.stderr
