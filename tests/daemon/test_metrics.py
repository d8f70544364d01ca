"""nsqcli.daemon.metrics: a real serve() scraped over HTTP and read with prometheus_client's own
parser; /healthz, /status, 404, a failing snapshot, bad addresses, a port in use."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nsqcli.daemon.metrics import parse_address, serve
from nsqcli.version import __version__


def snapshot(**changes) -> dict:
    snap = {
        "command": "to-file", "pid": 1234, "started_at": 1764236400.123, "uptime_seconds": 12.5,
        "state": "running",
        "topics": [{"topic": "t", "channel": "c", "received": 10, "finished": 7, "requeued": 2,
                    "timed_out": 1, "lost_responses": 3},
                   {"topic": "u", "channel": "c", "received": 5, "finished": 5, "requeued": 0,
                    "timed_out": 0, "lost_responses": 0}],
        "connections": [{"topic": "t", "channel": "c", "nsqd": "127.0.0.1:4150", "state": "subscribed",
                         "connected": True, "rdy": 200, "in_flight": 3, "connected_since": 1764236401.0},
                        {"topic": "t", "channel": "c", "nsqd": "127.0.0.1:4250", "state": "backoff",
                         "connected": False, "rdy": 0, "in_flight": 0, "connected_since": None}],
        "depth": [{"topic": "t", "channel": "c", "nsqd": "127.0.0.1:4150", "depth": 42, "in_flight": 3,
                   "deferred": 1, "seen_at": 1764236410.5}],
        "counters": {"bytes_written": 4096, "fsyncs": 9, "files_rotated": 2},
        "gauges": {"last_fsync_timestamp_seconds": 1764236411.25},
        "errors": {"source": 3, "write": 0, "destination": 0, "delivery": 0, "lookupd": 1},
        "latency": {"buckets": [[0.005, 3], [0.01, 7], ["+Inf", 12]], "sum": 0.42, "count": 12},
        "health": {"ok": True, "reason": ""},
    }
    snap.update(changes)
    return snap


def get(address: str, path: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def samples(text: str) -> dict:
    """{(sample name, ((label, value), ...)): value} of an exposition, via prometheus_client's parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def lab(**kw) -> tuple:
    return tuple(sorted({"command": "to-file", **kw}.items()))


@pytest.fixture
def server():
    state = {"snap": snapshot()}
    srv = serve("127.0.0.1:0", lambda: state["snap"])
    srv.state = state
    yield srv
    srv.close()


def test_metrics_names_labels_and_values(server):
    status, headers, body = get(server.address, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    got = samples(body.decode())
    tc = dict(topic="t", channel="c")
    assert got[("nsqcli_info", lab(version=__version__, pid="1234"))] == 1
    assert got[("nsqcli_uptime_seconds", lab())] == 12.5
    assert got[("nsqcli_start_time_seconds", lab())] == pytest.approx(1764236400.123)
    assert got[("nsqcli_healthy", lab())] == 1
    assert got[("nsqcli_messages_received_total", lab(**tc))] == 10
    assert got[("nsqcli_messages_received_total", lab(topic="u", channel="c"))] == 5
    assert got[("nsqcli_messages_finished_total", lab(**tc))] == 7
    assert got[("nsqcli_messages_requeued_total", lab(**tc))] == 2
    assert got[("nsqcli_messages_timed_out_total", lab(**tc))] == 1
    assert got[("nsqcli_responses_lost_total", lab(**tc))] == 3
    up, down = lab(nsqd="127.0.0.1:4150", **tc), lab(nsqd="127.0.0.1:4250", **tc)
    assert (got[("nsqcli_connection_up", up)], got[("nsqcli_connection_up", down)]) == (1, 0)
    assert (got[("nsqcli_connection_rdy", up)], got[("nsqcli_connection_rdy", down)]) == (200, 0)
    assert got[("nsqcli_connection_in_flight", up)] == 3
    assert got[("nsqcli_channel_depth", up)] == 42
    assert got[("nsqcli_channel_in_flight", up)] == 3
    assert got[("nsqcli_channel_deferred", up)] == 1
    assert got[("nsqcli_channel_seen_timestamp_seconds", up)] == pytest.approx(1764236410.5)
    assert ("nsqcli_channel_depth", down) not in got  # no /stats row for that node: no sample
    assert got[("nsqcli_bytes_written_total", lab())] == 4096
    assert got[("nsqcli_fsyncs_total", lab())] == 9
    assert got[("nsqcli_files_rotated_total", lab())] == 2
    assert got[("nsqcli_last_fsync_timestamp_seconds", lab())] == pytest.approx(1764236411.25)
    assert got[("nsqcli_errors_total", lab(kind="source"))] == 3
    assert got[("nsqcli_errors_total", lab(kind="lookupd"))] == 1
    assert got[("nsqcli_errors_total", lab(kind="write"))] == 0
    buckets = {dict(k[1])["le"]: v for k, v in got.items() if k[0] == "nsqcli_delivery_latency_seconds_bucket"}
    assert buckets == {"0.005": 3, "0.01": 7, "+Inf": 12}
    assert got[("nsqcli_delivery_latency_seconds_count", lab())] == 12
    assert got[("nsqcli_delivery_latency_seconds_sum", lab())] == pytest.approx(0.42)
    types = {f.name: f.type for f in text_string_to_metric_families(body.decode())}
    assert types["nsqcli_messages_received"] == "counter"
    assert types["nsqcli_bytes_written"] == "counter"
    assert types["nsqcli_channel_depth"] == "gauge"
    assert types["nsqcli_delivery_latency_seconds"] == "histogram"


def test_each_scrape_reads_the_snapshot_of_that_moment(server):
    """Counters move with the snapshot; another command's counters are its own names; None gives no sample."""
    server.state["snap"] = snapshot(command="to-http", latency=None,
                                    counters={"delivered": 77, "failed_attempts": 2, "sampled_out": 0},
                                    gauges={"last_fsync_timestamp_seconds": None})
    got = samples(get(server.address, "/metrics")[2].decode())
    c = (("command", "to-http"),)
    assert got[("nsqcli_delivered_total", c)] == 77
    assert got[("nsqcli_failed_attempts_total", c)] == 2
    assert ("nsqcli_bytes_written_total", c) not in got
    assert not any(k[0].startswith("nsqcli_delivery_latency") for k in got)
    assert not any(k[0] == "nsqcli_last_fsync_timestamp_seconds" for k in got)


def test_a_counter_that_would_clash_is_renamed():
    server = serve("127.0.0.1:0", lambda: snapshot(counters={"errors": 4, "a-b": 1}, gauges={"a_b": 2}))
    try:
        got = samples(get(server.address, "/metrics")[2].decode())
    finally:
        server.close()
    assert got[("nsqcli_counter_errors_total", lab())] == 4
    assert got[("nsqcli_a_b_total", lab())] == 1
    assert got[("nsqcli_gauge_a_b", lab())] == 2


def test_healthz_ok_then_unhealthy_with_the_reason(server):
    assert get(server.address, "/healthz")[::2] == (200, b"ok\n")
    reason = "every nsqd is down: 127.0.0.1:4150 (for 35s)"
    server.state["snap"] = snapshot(health={"ok": False, "reason": reason}, state="running")
    status, headers, body = get(server.address, "/healthz")
    assert (status, body) == (503, f"{reason}\n".encode())
    status, _, body = get(server.address, "/healthz?format=json")
    assert status == 503
    assert json.loads(body) == {"ok": False, "reason": reason, "state": "running", "uptime_seconds": 12.5}
    got = samples(get(server.address, "/metrics")[2].decode())
    assert got[("nsqcli_healthy", lab())] == 0


def test_status_is_the_whole_snapshot_and_other_paths_are_404(server):
    status, headers, body = get(server.address, "/status")
    assert status == 200 and json.loads(body) == server.state["snap"]
    for path in ("/", "/metric", "/metrics/x", "/favicon.ico"):
        assert get(server.address, path)[0] == 404, path


def test_a_failing_snapshot_is_500_and_the_server_keeps_serving():
    def broken():
        raise KeyError("topics")

    srv = serve("127.0.0.1:0", broken)
    try:
        for path in ("/metrics", "/healthz", "/status"):
            status, _, body = get(srv.address, path)
            assert status == 500, path
            assert body.count(b"\n") == 1 and body.startswith(b"snapshot failed: KeyError"), body
    finally:
        srv.close()
    # and a snapshot that fails once, then works
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("not yet")
        return snapshot()

    srv = serve("127.0.0.1:0", flaky)
    try:
        assert get(srv.address, "/metrics")[0] == 500
        assert get(srv.address, "/metrics")[0] == 200
    finally:
        srv.close()


def test_concurrent_scrapes(server):
    results = []

    def scrape():
        results.append(get(server.address, "/metrics")[0])

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [200] * 8


@pytest.mark.parametrize("address", ["", "9117", "localhost", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:70000",
                                     "::1:9117", "[::1:9117", "a b:9117", "http://127.0.0.1:9117"])
def test_bad_addresses_are_value_errors(address):
    with pytest.raises(ValueError) as e:
        serve(address, snapshot)
    assert "\n" not in str(e.value) and str(e.value)


def test_an_unknown_host_is_a_value_error():
    with pytest.raises(ValueError, match="not found"):
        serve("no-such-host.invalid:0", snapshot)


def test_parse_address():
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_address("[::1]:9117") == ("::1", 9117)
    assert parse_address(":9117") == ("", 9117)


def test_a_port_in_use_is_an_os_error():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    address = "%s:%d" % busy.getsockname()
    try:
        with pytest.raises(OSError) as e:
            serve(address, snapshot)
        assert str(e.value).startswith(f"cannot listen on {address}: ") and "\n" not in str(e.value)
        assert e.value.errno is not None
    finally:
        busy.close()


def test_close_releases_the_port():
    srv = serve("127.0.0.1:0", snapshot)
    address = srv.address
    srv.close()
    srv.close()  # idempotent
    with pytest.raises(OSError):
        get(address, "/metrics")
    again = serve(address, snapshot)  # the port can be taken again
    try:
        assert get(again.address, "/healthz")[0] == 200
    finally:
        again.close()


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        srv = serve("[::1]:0", snapshot)
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    try:
        assert srv.address.startswith("[::1]:")
        assert get(srv.address, "/healthz")[0] == 200
    finally:
        srv.close()


def test_importing_the_module_does_not_import_prometheus_client():
    code = ("import sys, nsqcli.daemon.metrics, nsqcli.daemon.statusfile, nsqcli.daemon.lag; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('prometheus_client', 'http', 'click', 'rich', 'logging')); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
