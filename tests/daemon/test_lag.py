"""nsqcli.daemon.lag against a real nsqd: the depth of a channel with N messages is N; a dead or
hung node gives no row and an error within the timeout; an nsqd on the default layout (HTTP on
TCP port + 1) is found from its /info, also when it was down at the first look."""

from __future__ import annotations

import socket
import time

import pytest
from tests.support.helpers import http_post, wait_for

from nsqcli.client import limits
from nsqcli.daemon.lag import Lag
from nsqcli.sandbox import Server, find_binary, free_port


def channel_with(nsqd, topic: str, channel: str, n: int, deferred: int = 0) -> None:
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel=channel)
    if n:
        http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(n)), topic=topic)
    for _ in range(deferred):
        http_post(nsqd.http_address, "/pub", b"later", topic=topic, defer="600000")


def test_a_channel_with_n_messages_shows_depth_n(nsqd, topic):
    channel_with(nsqd, topic, "c", 5, deferred=2)
    limits.note_http(nsqd.tcp_address, nsqd.http_address)  # as nsqlookupd tells it
    before = time.time()
    lag = Lag()
    rows = lag.poll([(topic, "c", nsqd.tcp_address)], timeout=2.0)
    assert lag.errors == {}
    assert len(rows) == 1
    row = rows[0]
    assert before - 1 <= row.pop("seen_at") <= time.time() + 1
    assert row == {"topic": topic, "channel": "c", "nsqd": nsqd.tcp_address, "depth": 5, "in_flight": 0,
                   "deferred": 2}
    http_post(nsqd.http_address, "/mpub", b"x\ny\nz", topic=topic)
    # read again each poll (nsqd copies a topic's messages into its channels in a goroutine of
    # its own: on a busy machine the next /stats can come before the copy)
    wait_for(lambda: lag.poll([(topic, "c", nsqd.tcp_address)], timeout=2.0)[0]["depth"] == 8, 10,
             what="depth 8 in the next polls")


def test_many_topics_and_channels_of_one_nsqd(nsqd, topic):
    channel_with(nsqd, topic + "_a", "c1", 3)
    http_post(nsqd.http_address, "/channel/create", topic=topic + "_a", channel="c2")  # created after: empty
    channel_with(nsqd, topic + "_b", "c", 4)
    limits.note_http(nsqd.tcp_address, nsqd.http_address)
    lag = Lag()
    targets = [(topic + "_b", "c", nsqd.tcp_address), (topic + "_a", "c1", nsqd.tcp_address),
               (topic + "_a", "c2", nsqd.tcp_address), (topic + "_a", "nope", nsqd.tcp_address)]
    rows = lag.poll(targets, timeout=2.0)
    assert [(r["topic"], r["channel"], r["depth"]) for r in rows] == [
        (topic + "_b", "c", 4), (topic + "_a", "c1", 3), (topic + "_a", "c2", 0)]  # no channel: no row
    assert lag.errors == {}


def test_a_dead_and_a_hung_node_give_no_row_and_an_error_within_the_timeout(nsqd, topic):
    channel_with(nsqd, topic, "c", 2)
    limits.note_http(nsqd.tcp_address, nsqd.http_address)
    dead_tcp = f"127.0.0.1:{free_port()}"
    limits.note_http(dead_tcp, f"127.0.0.1:{free_port()}")  # nothing listens there
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)  # accepts (the kernel does) and never answers
    hung_tcp = f"127.0.0.1:{free_port()}"
    limits.note_http(hung_tcp, "127.0.0.1:%d" % hung.getsockname()[1])
    try:
        lag = Lag()
        t0 = time.monotonic()
        rows = lag.poll([(topic, "c", dead_tcp), (topic, "c", hung_tcp), (topic, "c", nsqd.tcp_address)],
                        timeout=1.0)
        took = time.monotonic() - t0
    finally:
        hung.close()
    assert took < 1.0 + 0.5, took
    assert [(r["nsqd"], r["depth"]) for r in rows] == [(nsqd.tcp_address, 2)]
    assert set(lag.errors) == {dead_tcp, hung_tcp}
    assert all(e.startswith(a + ": ") and "\n" not in e for a, e in lag.errors.items())


def test_an_nsqd_whose_http_address_cannot_be_found(topic):
    lonely = f"127.0.0.1:{free_port()}"  # nothing on TCP port + 1 either, nsqlookupd said nothing
    lag = Lag()
    t0 = time.monotonic()
    assert lag.poll([(topic, "c", lonely)], timeout=1.0) == []
    assert time.monotonic() - t0 < 1.5
    assert "HTTP address is not known" in lag.errors[lonely]
    assert lag.poll([], timeout=1.0) == [] and lag.errors == {}


def two_free_ports() -> int:
    """P such that P and P + 1 were both free just now (nsqd's default layout: HTTP on TCP + 1)."""
    for _ in range(50):
        a, b = socket.socket(), socket.socket()
        try:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
        finally:
            a.close()
            b.close()
    pytest.skip("no two adjacent free ports")


@pytest.mark.nsq_server
def test_an_nsqd_down_at_the_first_look_is_found_when_back(tmp_path, topic):
    """HTTP on TCP port + 1 confirmed by /info (no nsqlookupd); a node down at the first poll
    gives an error then, and rows once it is up (looked for again after RETRY)."""
    port = two_free_ports()
    tcp, http = f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"
    server = Server("nsqd", [find_binary("nsqd"), f"--tcp-address={tcp}", f"--http-address={http}",
                             "--https-address=", f"--data-path={tmp_path}", "--broadcast-address=127.0.0.1"],
                    http, tcp, tmp_path / "nsqd.log")
    lag = Lag()
    assert lag.poll([(topic, "c", tcp)], timeout=1.0) == []
    assert "HTTP address is not known" in lag.errors[tcp]
    server.start()
    try:
        channel_with(server, topic, "c", 3)
        assert lag.poll([(topic, "c", tcp)], timeout=1.0) == []  # not looked for again before RETRY
        lag.retry = 0.0  # as if RETRY seconds had passed
        rows = lag.poll([(topic, "c", tcp)], timeout=2.0)
        assert [(r["nsqd"], r["depth"]) for r in rows] == [(tcp, 3)], lag.errors
        assert limits.http_address_of(tcp, time.monotonic() + 1) == http  # told to limits for the others
    finally:
        server.stop()


def test_an_answer_that_is_not_nsqds_stats_is_an_error_not_a_crash(topic):
    """Something else on the HTTP port (a proxy's JSON, an old API): an error for that node, no row."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answers = iter([b"[1, 2]", json.dumps({"topics": [1]}).encode(), b"not json"])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(answers, b"{}")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    tcp = f"127.0.0.1:{free_port()}"
    limits.note_http(tcp, "127.0.0.1:%d" % httpd.server_address[1])
    try:
        lag = Lag()
        for _ in range(3):
            assert lag.poll([(topic, "c", tcp)], timeout=1.0) == []
            assert "not nsqd's JSON stats" in lag.errors[tcp], lag.errors
    finally:
        httpd.shutdown()
        httpd.server_close()
