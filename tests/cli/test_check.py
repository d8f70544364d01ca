"""`nsqcli check` against real nsqd: the Nagios line and exit codes (OK, WARNING, CRITICAL,
UNKNOWN), Prometheus text read back with prometheus_client's parser, the JSON document."""

from __future__ import annotations

import json
import re
import socket
import time

from tests.support.helpers import channel_stats, http_post, lookup_producers, run_nsqcli, wait_for

from tests.support.hung import stopped

from nsqcli import Config, Consumer

PERF = re.compile(r"'([^']*)'=(-?[\d.]+)(c?);([^;]*);([^;]*);(\S*)")


def nagios(r) -> tuple[str, str, dict]:
    """(status word, the text after it, {label: (value, warn, crit)}) of the one Nagios line."""
    out = r.stdout.decode()
    assert out.endswith("\n") and out.count("\n") == 1, out
    head, _, perf = out.strip().partition(" | ")
    m = re.match(r"^NSQ (OK|WARNING|CRITICAL|UNKNOWN) - (.+)$", head)
    assert m, out
    data = {label: (float(v), warn, crit) for label, v, _uom, warn, crit, _min in PERF.findall(perf)}
    assert len(data) == perf.count("="), perf  # every perfdata item parsed
    return m.group(1), m.group(2), data


def backlog(nsqd, topic, n):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="c")
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(n)), topic=topic)


def check(nsqd, topic, *args):
    return run_nsqcli(["check", topic, "--nsqd-http-address", nsqd.http_address, *args])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nagios_ok_warning_critical(nsqd, topic):
    backlog(nsqd, topic, 3)
    r = check(nsqd, topic, "--depth-warn", "100", "--depth-crit", "1000")
    status, text, perf = nagios(r)
    assert (r.returncode, status) == (0, "OK"), r.stdout
    assert text == "1 nsqd up, 1 channel, depth 3, in flight 0, requeued 0, timed out 0"
    assert perf[f"{topic}/c depth"] == (3.0, "100", "1000")
    assert perf["nodes_up"][0] == 1 and perf["nodes_down"] == (0.0, "", "0")

    r = check(nsqd, topic, "--depth-warn", "2", "--depth-crit", "10")
    status, text, perf = nagios(r)
    assert (r.returncode, status, text) == (1, "WARNING", f"{topic}/c depth 3 > 2")
    assert perf[f"{topic}/c depth"] == (3.0, "2", "10")

    r = check(nsqd, topic, "--depth-warn", "1", "--depth-crit", "2", "--clients-min", "1")
    status, text, perf = nagios(r)
    assert (r.returncode, status) == (2, "CRITICAL"), r.stdout
    assert text == f"{topic}/c depth 3 > 2; {topic}/c has 0 clients < 1"
    assert perf[f"{topic}/c clients"] == (0.0, "", "1:")
    assert r.stderr == b""


def test_requeues_are_nsqds_count(nsqd, topic):
    backlog(nsqd, topic, 1)
    c = Consumer(topic, "c", lambda m: m.requeue(delay=60, backoff=False), nsqd_tcp_addresses=[nsqd.tcp_address],
                 config=Config(max_backoff_duration=0))
    c.start()
    try:
        wait_for(lambda: channel_stats(nsqd, topic, "c")["requeue_count"] == 1, what="a REQ")
        r = check(nsqd, topic, "c", "--requeues-warn", "0", "--requeues-crit", "5", "--clients-min", "1")
    finally:
        c.stop()
    status, text, perf = nagios(r)
    assert (r.returncode, status, text) == (1, "WARNING", f"{topic}/c requeued 1 > 0")
    assert perf[f"{topic}/c requeued"] == (1.0, "0", "5") and perf[f"{topic}/c deferred"][0] == 1.0


def test_a_node_down_is_critical_nothing_answering_is_unknown(nsqd, topic):
    backlog(nsqd, topic, 1)
    dead = f"127.0.0.1:{free_port()}"
    r = check(nsqd, topic, "--nsqd-http-address", dead)
    status, text, perf = nagios(r)
    assert (r.returncode, status) == (2, "CRITICAL")
    assert text.startswith(f"nsqd {dead} down: ") and "Connection refused" in text
    assert perf["nodes_up"][0] == 1 and perf["nodes_down"][0] == 1

    r = check(nsqd, topic, "--lookupd-http-address", dead)
    status, text, _ = nagios(r)
    assert (r.returncode, status) == (2, "CRITICAL") and text.startswith(f"nsqlookupd {dead} down: "), text

    r = run_nsqcli(["check", "--nsqd-http-address", dead])
    status, text, perf = nagios(r)
    assert (r.returncode, status, perf) == (3, "UNKNOWN", {})
    assert text.startswith(f"no nsqd answered: {dead}: ")
    r = run_nsqcli(["check", "--lookupd-http-address", dead, "--format", "json"])
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["status"] == "UNKNOWN" and doc["summary"].startswith("no nsqlookupd answered")

    r = check(nsqd, topic + "_none")
    status, text, _ = nagios(r)
    assert (r.returncode, status) == (2, "CRITICAL") and text.startswith(f"topic {topic}_none exists on no nsqd")


def test_prometheus_text_parses(nsqd, topic):
    from prometheus_client.parser import text_string_to_metric_families

    backlog(nsqd, topic, 4)
    r = check(nsqd, topic, "--format", "prometheus", "--depth-warn", "3")
    assert r.returncode == 1, r.stderr
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(r.stdout.decode()) for s in fam.samples}
    node = nsqd.http_address
    labels = (("channel", "c"), ("node", node), ("topic", topic))
    assert samples[("nsq_check_status", ())] == 1
    assert samples[("nsq_check_problems", (("severity", "warning"),))] == 1
    assert samples[("nsq_up", (("address", node), ("kind", "nsqd")))] == 1
    assert samples[("nsq_channel_depth", labels)] == 4
    assert samples[("nsq_channel_in_flight", labels)] == 0
    assert samples[("nsq_channel_requeued_total", labels)] == 0
    assert samples[("nsq_channel_messages_total", labels)] == 4
    assert samples[("nsq_topic_depth", (("node", node), ("topic", topic)))] == 0


def test_json_and_text(nsqd, topic):
    backlog(nsqd, topic, 2)
    r = check(nsqd, topic, "--format", "json", "--in-flight-crit", "5")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["status"] == "OK" and doc["code"] == 0 and doc["problems"] == []
    assert set(doc) == {"status", "code", "summary", "problems", "nodes", "lookupd", "thresholds", "channels"}
    assert doc["nodes"] == {"up": [nsqd.http_address], "down": {}}
    assert doc["thresholds"]["in_flight_crit"] == 5 and doc["thresholds"]["depth_warn"] is None
    (ch,) = doc["channels"]
    assert (ch["topic"], ch["channel"], ch["depth"], ch["in_flight"], ch["deferred"], ch["clients"]) == (
        topic, "c", 2, 0, 0, 0)

    r = check(nsqd, topic, "--format", "json", "--depth-crit", "1")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["problems"] == [
        {"severity": "critical", "text": f"{topic}/c depth 2 > 1", "topic": topic, "channel": "c",
         "metric": "depth", "value": 2, "threshold": 1}]

    r = check(nsqd, topic, "--format", "text", "--depth-crit", "1")
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 2 and lines[0] == "NSQ CRITICAL: 1 problem"
    assert lines[1].split() == ["CRITICAL", f"{topic}/c", "depth", "2", ">", "1"]
    assert lines[3].split() == [f"{topic}/c", "2", "0", "0", "0", "0", "0"]


def test_usage_errors():
    r = run_nsqcli(["check", "--depth-warn", "10", "--depth-crit", "5"])
    assert r.returncode == 2 and r.stderr.decode().strip() == (
        "nsqcli: error: --depth-warn 10 is above --depth-crit 5 (see 'nsqcli check --help')")
    r = run_nsqcli(["check", "--format", "xml"])
    assert r.returncode == 2 and b"Traceback" not in r.stderr


def test_nodes_found_through_nsqlookupd(sandbox, nsqd, topic):
    backlog(nsqd, topic, 2)
    wait_for(lambda: lookup_producers(sandbox.lookupd, topic), what="the topic registered")
    r = run_nsqcli(["check", topic, "c", "--lookupd-http-address", sandbox.lookupd.http_address, "--depth-warn", "1"])
    status, text, perf = nagios(r)
    assert (r.returncode, status, text) == (1, "WARNING", f"{topic}/c depth 2 > 1"), r.stdout
    assert perf["nodes_up"][0] == 1


def test_a_hung_nsqd_is_critical_within_the_request_timeout(nsqd, nsqd_factory, topic):
    backlog(nsqd, topic, 1)
    hung = nsqd_factory()
    t0 = time.monotonic()
    with stopped(hung):
        r = check(nsqd, topic, "--nsqd-http-address", hung.http_address, "--http-client-request-timeout", "1s",
                  "--format", "json")
    took = time.monotonic() - t0
    doc = json.loads(r.stdout)
    # 1 s of request timeout, the rest the interpreter's start-up and exit on a busy machine (the
    # default timeout would take 5 s)
    assert r.returncode == 2 and took < 1.0 + 3.0, (took, r.stderr)
    assert doc["nodes"]["up"] == [nsqd.http_address] and list(doc["nodes"]["down"]) == [hung.http_address]
    assert doc["problems"] == [{"severity": "critical", "node": hung.http_address,
                                "text": f"nsqd {hung.http_address} down: no complete answer within 1s (slow to answer)"}]


def test_sigterm_ends_a_check_at_once():
    import signal
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env

    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        p = subprocess.Popen(NSQCLI + ["check", "--nsqd-http-address", "127.0.0.1:%d" % silent.getsockname()[1]],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
        silent.settimeout(20)
        conn, _ = silent.accept()
        with conn:
            assert conn.recv(4096).startswith(b"GET ")  # the check is inside its request
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=3)  # the request timeout is 5 s
    assert (p.returncode, out, err) == (143, b"", b"nsqcli: interrupted (SIGTERM)\n")


# -- refusals: bad input (one line, the documented exit code) --------------------------------------------
import pytest  # noqa: E402
from tests.support.refusals import bad_input, ids  # noqa: E402

BAD_INPUT = [
    (["check", "t", "c", "--depth-warn", "10", "--depth-crit", "5"], 2, r"--depth-warn 10 is above --depth-crit 5"),
    (["check", "t", "c", "--format", "xml"], 2, r"'--format': 'xml' is not one of 'nagios'"),
    (["check", "t", "c", "--timeout", "0"], 2, r"'--timeout': must be more than 0 \(leave it out for no deadline\)"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)
