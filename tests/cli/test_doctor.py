"""`nsqcli doctor` against real nsqd/nsqlookupd."""

from __future__ import annotations

import importlib.util
import json
import re
import time

import pytest

from tests.support.helpers import http_post, run_nsqcli, wait_for
from tests.support.hung import cluster, stopped  # noqa: F401 - cluster: the fixture
from tests.support.portforward import PortPair

#: doctor's last check says what the installed pyspark supports (the test env has the spark extra)
SPARK = 1 if importlib.util.find_spec("pyspark") else 0


# -- doctor ----------------------------------------------------------------------------------------
def test_doctor_checks_the_cluster(nsqd, lookupd, topic):
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="c1")
    env = {"NSQCLI_LOOKUPD_HTTP_ADDRESS": lookupd.http_address}
    wait_for(lambda: topic in run_nsqcli(["lookup"], env).stdout.decode(), what="lookupd knows the topic")
    r = run_nsqcli(["doctor", "-t", topic, "--json"], env)
    assert r.returncode == 0, r.stdout
    doc = json.loads(r.stdout)
    assert doc["ok"] is True
    targets = {c["target"]: c for c in doc["checks"]}
    assert targets[f"nsqlookupd {lookupd.http_address}"]["detail"].startswith("v1.3.0, ")
    tcp = targets[f"nsqd {nsqd.tcp_address} (TCP)"]
    assert "v1.3.0" in tcp["detail"] and "no TLS" in tcp["detail"] and "no AUTH" in tcp["detail"]
    http = targets[f"nsqd {nsqd.http_address} (HTTP)"]
    assert re.search(rf"clock skew [+-]?\d+s .*topic '{topic}': depth 0, channels c1", http["detail"])
    text = run_nsqcli(["doctor", "-t", topic], env).stdout.decode()
    assert text.splitlines()[-1].endswith("0 failed") and f"ok   nsqd {nsqd.tcp_address} (TCP): v1.3.0" in text


def test_doctor_names_port_mixups_with_the_fix(nsqd):
    r = run_nsqcli(["doctor", "--lookupd-http-address", nsqd.http_address, "--nsqd-tcp-address", nsqd.http_address,
                    "--nsqd-http-address", nsqd.tcp_address, "--json"])
    assert r.returncode == 1 and r.stderr.decode() == f"nsqcli: error: 3 of {3 + SPARK} checks failed\n"
    checks = {c["target"].split(" ")[0] + c["target"][-6:]: c for c in json.loads(r.stdout)["checks"]}
    lk = next(c for c in json.loads(r.stdout)["checks"] if c["target"].startswith("nsqlookupd"))
    assert "(it is an nsqd)" in lk["detail"] and "usually 4161" in lk["fix"]
    tcp = next(c for c in checks.values() if c["target"].endswith("(TCP)"))
    assert tcp["status"] == "fail" and "usually 4150" in tcp["fix"] and "HTTP" in tcp["detail"]
    http = next(c for c in checks.values() if c["target"].endswith("(HTTP)"))
    assert http["status"] == "fail" and "usually 4151" in http["fix"]


def test_doctor_reports_tls_and_auth(nsqd_factory, tmp_path):
    from tests.support.nsq_fixtures import AuthServer, make_cert

    cert, key = make_cert(tmp_path)
    with AuthServer({"s3cret": [(".*", [".*"], ["subscribe", "publish"])]}) as auth:
        server = nsqd_factory(tls_cert=cert, tls_key=key, auth_http_address=auth.address)
        base = ["doctor", "--json", "--nsqd-tcp-address", server.tcp_address, "--nsqd-http-address",
                server.http_address, "--tls", "--tls-ca-file", cert]
        r = run_nsqcli(base + ["--auth-secret", "s3cret"])
        assert r.returncode == 0, r.stdout
        tcp = json.loads(r.stdout)["checks"][0]
        assert ", TLS," in tcp["detail"] and "AUTH ok as 'user-s3cret'" in tcp["detail"] and "s3cret'" not in tcp["fix"]
        r = run_nsqcli(base)
        tcp = json.loads(r.stdout)["checks"][0]
        assert r.returncode == 1 and tcp["status"] == "fail" and "requires authentication" in tcp["detail"]
        assert tcp["fix"].startswith("give --auth-secret-file FILE")


def test_doctor_checks_every_node_at_once_and_names_the_hung_ones(cluster):
    """Two of three nsqd hang (SIGSTOP): doctor checks every node at once, so the run costs one
    check's deadline (TCP: 1 s dial + 5 s handshake) instead of ~9 s per hung node, and every
    hung node fails by address with the fix for a stopped process; the healthy one is ok."""
    healthy, *hung = cluster.nsqds
    with stopped(*hung):
        t0 = time.monotonic()
        r = run_nsqcli(["doctor", "--json", "--lookupd-http-address", cluster.lookupd.http_address], timeout=60)
        took = time.monotonic() - t0
    assert r.returncode == 1 and r.stderr.decode() == f"nsqcli: error: 4 of {7 + SPARK} checks failed\n", r.stderr
    assert took < 9.0, took  # one node after another: 2 x (6 + 3) s
    checks = {c["target"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks[f"nsqlookupd {cluster.lookupd.http_address}"]["detail"].startswith("v1.3.0, 3 nsqd registered")
    assert checks[f"nsqd {healthy.tcp_address} (TCP)"]["status"] == "ok"
    assert checks[f"nsqd {healthy.http_address} (HTTP)"]["status"] == "ok"
    for node in hung:
        for c in (checks[f"nsqd {node.tcp_address} (TCP)"], checks[f"nsqd {node.http_address} (HTTP)"]):
            assert c["status"] == "fail" and ("in time" in c["detail"] or "no complete answer within 3s" in c["detail"])
            assert "stopped" in c["fix"]


def test_doctor_warns_when_tcp_port_plus_one_is_another_nsqds(nsqd, nsqd_factory):
    """nsqd reached through a port forward P -> its TCP, P + 1 -> another nsqd's HTTP: the HTTP
    check taken from P + 1 says that /info names another TCP port (before: 'ok ... TCP port N')."""
    other = nsqd_factory()
    other_tcp_port = int(other.tcp_address.rsplit(":", 1)[1])
    with PortPair(nsqd.tcp_address, other.http_address) as fwd:
        r = run_nsqcli(["doctor", "--nsqd-tcp-address", fwd.address])
    out = r.stdout.decode()
    assert r.returncode == 0, (out, r.stderr)  # a warning, not a failure
    assert (f"warn nsqd 127.0.0.1:{fwd.port + 1} (HTTP): v1.3.0, TCP port {other_tcp_port}, not {fwd.port}: "
            f"this is not the HTTP port of nsqd {fwd.address} (taken as its TCP port + 1), ") in out, out
    assert (f"    fix: give nsqd {fwd.address}'s HTTP address with --nsqd-http-address (its TCP port + 1 is "
            "another nsqd's, or a port forward's)\n") in out
    assert out.splitlines()[-1] == f"{1 + SPARK} ok, 1 warnings, 0 failed"


def test_doctor_default_layout_nsqd_is_ok(tmp_path):
    from tests.support.nsq_fixtures import default_layout_nsqd

    sb = default_layout_nsqd(tmp_path)
    try:
        r = run_nsqcli(["doctor", "--nsqd-tcp-address", sb.nsqd.tcp_address])
        port = sb.nsqd.tcp_address.rsplit(":", 1)[1]
        assert r.returncode == 0 and f"ok   nsqd {sb.nsqd.http_address} (HTTP): v1.3.0, TCP port {port}, " in \
            r.stdout.decode(), r.stdout
    finally:
        sb.stop()


@pytest.mark.spark_lts
def test_doctor_and_version_say_what_the_installed_pyspark_supports(nsqd):
    from importlib import metadata

    version = metadata.version("pyspark")
    r = run_nsqcli(["doctor", "--json", "--nsqd-tcp-address", nsqd.tcp_address])
    check = json.loads(r.stdout)["checks"][-1]
    assert check["target"] == f"pyspark {version}" and "nsq source: exactly once" in check["detail"]
    in_batches = tuple(int(x) for x in version.split(".")[:2]) >= (4, 2)
    assert check["status"] == ("ok" if in_batches else "warn")
    assert ("one batch per start" in check["detail"]) != in_batches
    out = run_nsqcli(["version"]).stdout.decode()
    assert f"pyspark        {version}\n                 nsq source: exactly once" in out


# -- refusals: bad input, grammar (one line, exit 2) ----------------------------------------------------
from tests.support.refusals import bad_input, grammar_row, ids  # noqa: E402

BAD_INPUT = [
    (["doctor", "-t", "bad topic"], 2, r"invalid topic name 'bad topic'"),
    (["doctor", "--nsqd-tcp-address", "x"], 2, r"invalid address 'x': expected HOST:PORT"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["doctor", "a", "-t", "b"], 2, r"TOPIC given twice"),
    (["doctor", "--timeout", "0"], 2, r"'--timeout': must be more than 0"),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)
