"""nsqcli to-http against a real local HTTP server that the test starts: deliveries, GET
escaping, 500s, Retry-After, a slow endpoint (timeout), a dead endpoint (backoff, not a spin),
http.server with its backlog of 5 (closing after each answer), --timeout as the whole
command's deadline (a hung lookupd, requests in flight)."""

from __future__ import annotations

import re
import threading
import time

import pytest
from tests.support.fakes import HTTPEndpoint as Endpoint
from tests.support.helpers import http_post, run_nsqcli, topic_stats
from tests.support.inprocess import run_in_process
from tests.support.hung import cluster, stopped  # noqa: F401


@pytest.fixture
def endpoint():
    made = []

    def make(script=None):
        e = Endpoint(script)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def chan(nsqd, topic):
    return topic_stats(nsqd, topic)["channels"][0]


def test_post_delivers_every_message_with_headers(nsqd, topic, endpoint):
    ep = endpoint()
    bodies = [b"m%03d" % i for i in range(300)]
    http_post(nsqd.http_address, "/mpub", b"\n".join(bodies), topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url + "/ingest", "--header", "X-Token: abc",
                    "--content-type", "text/plain", "-n", "300", "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(ep.bodies()) == bodies
    h = ep.requests[0]["headers"]
    assert ep.requests[0]["path"] == "/ingest" and h["X-Token"] == "abc" and h["Content-Type"] == "text/plain"
    c = chan(nsqd, topic)
    assert (c["depth"], c["in_flight_count"], c["requeue_count"], c["message_count"]) == (0, 0, 0, 300)
    assert "delivered 300, failed attempts 0" in r.stderr.decode()


def test_get_escapes_the_body_and_needs_200(nsqd, topic, endpoint):
    ep = endpoint(lambda body, n: (204 if n == 1 else 200, {}, 0))
    http_post(nsqd.http_address, "/pub", "a b&c=ü".encode(), topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--get", ep.url + "/hook?msg=%s", "-n", "1", "--requeue-delay", "100ms",
                    "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0, r.stderr
    assert [rq["body"].decode("utf-8") for rq in ep.requests] == ["a b&c=ü"] * 2  # 204 is not a GET success
    assert chan(nsqd, topic)["requeue_count"] == 1


def test_500s_requeue_until_delivered(nsqd, topic, endpoint):
    # one message, failing twice in a row: one outage, said once. Each failure is a back-off
    # (2 s, then 4 s); three messages failing twice each took 45 s of back-off on a busy run
    ep = endpoint(lambda body, n: (500, {}, 0) if n <= 2 else (200, {}, 0))
    http_post(nsqd.http_address, "/pub", b"a", topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url, "-n", "1", "--requeue-delay", "100ms",
                    "--nsqd-tcp-address", nsqd.tcp_address], timeout=120)
    assert r.returncode == 0, r.stderr
    assert ep.bodies() == [b"a", b"a", b"a"]
    c = chan(nsqd, topic)
    assert c["requeue_count"] == 2 and c["depth"] == 0 and c["in_flight_count"] == 0
    # said once (a run past 30 s of back-off also has the outage's reminder, "still failing after 30s")
    assert sum("HTTP 500" in ln and "still failing" not in ln for ln in r.stderr.decode().splitlines()) == 1
    assert "delivered 1, failed attempts 2" in r.stderr.decode()


def test_retry_after_sets_when_the_message_comes_back(nsqd_factory, topic, endpoint):
    # An nsqd of its own: nsqd looks at a channel's deferred messages only once its queue
    # scan's list of channels holds it, refreshed every 5 s from nsqd's start
    # (QueueScanRefreshInterval, no flag); on the session's nsqd a channel made now may wait up
    # to 5 s. Here the channel is made right after nsqd started, and the message is due
    # >= 2.5 + 3 s later, after the first refresh. (The random 20-channel draw of each scan is
    # dealt with for every test in conftest's sandbox.)
    nsqd = nsqd_factory()
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="nsq_to_http")
    time.sleep(2.5)
    # 3 s, not the backoff's 2 s: the message must come back after what the endpoint asked for,
    # never with the consumer's backoff (or after --requeue-delay's 100 ms)
    ep = endpoint(lambda body, n: (503, {"Retry-After": "3"}, 0) if n == 1 else (200, {}, 0))
    http_post(nsqd.http_address, "/pub", b"later", topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url, "-n", "1", "--requeue-delay", "100ms",
                    "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0, r.stderr
    first, second = ep.requests
    assert 2.9 <= second["time"] - first["time"] <= 6, second["time"] - first["time"]


def test_a_slow_endpoint_times_out_and_is_retried(nsqd, topic, endpoint):
    ep = endpoint(lambda body, n: (200, {}, 3.0 if n == 1 else 0))
    http_post(nsqd.http_address, "/pub", b"slow", topic=topic)
    t0 = time.monotonic()
    r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url, "-n", "1", "--http-timeout", "1s",
                    "--requeue-delay", "100ms", "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0, r.stderr
    assert b"timed out" in r.stderr and len(ep.requests) == 2 and chan(nsqd, topic)["requeue_count"] == 1
    assert time.monotonic() - t0 < 15


def test_a_failing_endpoint_backs_the_consumer_off(nsqd, topic, endpoint):
    ep = endpoint(lambda body, n: (500, {}, 0))
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"x%d" % i for i in range(50)), topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url, "--requeue-delay", "10ms", "--idle-timeout", "5s",
                    "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0
    # without backoff 50 messages requeued every 10 ms would make thousands of requests in 5 s
    assert len(ep.requests) < 150, len(ep.requests)
    c = chan(nsqd, topic)
    assert c["depth"] + c["in_flight_count"] + c["deferred_count"] == 50  # nothing lost, nothing FINed


def test_dead_endpoint_and_bad_flags(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--post", "http://127.0.0.1:1/x", "--idle-timeout", "2s",
                    "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0 and b"POST http://127.0.0.1:1/x: Connection refused" in r.stderr
    c = chan(nsqd, topic)
    assert c["depth"] + c["in_flight_count"] + c["deferred_count"] == 1
    for args, words in ((["--post", "http://a", "--get", "http://b?%s"], b"give --post URL or --get URL (not both)"),
                        (["--get", "http://b/"], b"a --get URL needs exactly one %s"),
                        (["--post", "ftp://x"], b"invalid URL 'ftp://x'"),
                        (["--post", "http://a", "--header", "nocolon"], b"--header 'nocolon' must be 'Key: value'")):
        r = run_in_process(["to-http", "-t", topic, *args])
        assert r.returncode == 2 and words in r.stderr, r.stderr


@pytest.mark.parametrize("answer,status,body,left", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokNEXT", 200, b"ok", b"NEXT"),
    (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n3;x=1\r\nabc\r\n0\r\n\r\nNEXT",
     201, b"okabc", b"NEXT"),
    (b"HTTP/1.1 204 No Content\r\nRetry-After: 7\r\n\r\nNEXT", 204, b"", b"NEXT"),
    (b"HTTP/1.0 500 Oops\r\n\r\nbody until close", 500, b"body until close", b""),
])
def test_response_reader_frames_answers_on_a_kept_alive_socket(answer, status, body, left):
    """The project's one HTTP/1.1 reader (client/http.py, no email parser), as to-http and the
    lookupd/nsqd helpers use it: Content-Length, chunked, no body, close-delimited; what
    follows an answer stays for the next one."""
    import socket

    from nsqcli.client.http import read_response

    a, b = socket.socketpair()
    try:
        for i in range(0, len(answer), 7):  # trickled in small pieces
            b.sendall(answer[i:i + 7])
        if status == 500:
            b.close()
        got_status, _, headers, got_body, rest = read_response(a, b"", time.monotonic() + 5)
    finally:
        a.close()
        if status != 500:
            b.close()
    assert (got_status, got_body, rest) == (status, body, left)
    if status == 204:
        assert headers["retry-after"] == "7"
    if status == 500:
        assert headers["connection"] == "close"


@pytest.mark.parametrize("answer,close,words", [
    (b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL", False, "not an HTTP answer"),  # nsqd's TCP port
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", True, "answer cut short (3 of 10 bytes)"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n", False, "answer larger than 1000 bytes"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n", False, "answer larger than 1000 bytes"),
    (b"", True, "the server closed the connection before answering"),
    (b"HTTP/1.1 200 O", True, "answer cut short (the server closed after 14 bytes of its head)"),
])
def test_response_reader_refuses_what_is_not_a_whole_answer(answer, close, words):
    """Garbage is refused at once (no waiting for the deadline), a body cut short or over the
    size limit is an error, never a short or huge answer."""
    import socket

    from nsqcli.client.http import ResponseError, read_response

    a, b = socket.socketpair()
    try:
        b.sendall(answer)
        if close:
            b.shutdown(socket.SHUT_WR)
        t0 = time.monotonic()
        with pytest.raises(ResponseError, match=re.escape(words)):
            read_response(a, b"", time.monotonic() + 5, max_size=1000)
        assert time.monotonic() - t0 < 1
    finally:
        a.close()
        b.close()


def test_response_reader_gives_up_at_its_deadline():
    import socket

    from nsqcli.client.http import read_response

    a, b = socket.socketpair()
    try:
        b.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            read_response(a, b"", time.monotonic() + 0.3)
        assert time.monotonic() - t0 < 2
    finally:
        a.close()
        b.close()


def test_one_connection_carries_many_requests(endpoint):
    """HTTPConnection keeps its socket between requests (to-http's throughput depends on it)
    and opens a new one after the server said Connection: close."""
    from nsqcli.client.http import HTTPConnection

    ep = endpoint(lambda body, n: (200, {"Connection": "close"} if body == b"bye" else {}, 0))
    port = int(ep.url.rpartition(":")[2])
    conn = HTTPConnection("http", "127.0.0.1", port, f"127.0.0.1:{port}")
    try:
        socks = []
        for body in (b"a", b"b", b"bye", b"c"):
            status, _, _, answer = conn.request("POST", "/x", time.monotonic() + 5, body)
            assert (status, answer) == (200, b"ok")
            socks.append(conn.sock)
        assert socks[0] is socks[1] and socks[2] is None and socks[3] is not None
        assert ep.bodies() == [b"a", b"b", b"bye", b"c"]
    finally:
        conn.close()


def test_losing_the_source_nsqd_is_said_counted_and_recovered_twice(nsqd_factory, topic, endpoint):
    """to-http's consumer errors reach stderr: the lost nsqd is said once when it goes (its
    reconnect failures are counted, not printed), 'recovered' when it is back, and a second
    outage is said again."""
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env, plain_lines, wait_for

    src = nsqd_factory()
    ep = endpoint()
    http_post(src.http_address, "/pub", b"one", topic=topic)
    env = clean_env()
    p = subprocess.Popen(NSQCLI + ["to-http", "-t", topic, "--post", ep.url, "--nsqd-tcp-address", src.tcp_address],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(plain_lines(ln.decode())[0] for ln in iter(p.stderr.readline, b"")),
                              daemon=True)
    reader.start()
    try:
        wait_for(lambda: ep.bodies() == [b"one"], timeout=20, what="first delivery")
        def started():  # outages said as new (a changed text is said again with its count "(xN ")
            return sum("warning: source:" in ln and " (x" not in ln for ln in lines)

        for round_ in (1, 2):
            src.stop()
            wait_for(lambda: started() == round_, timeout=20, what=f"outage {round_} said")
            time.sleep(3)  # reconnects keep failing (~5 times) meanwhile: counted, not said each time
            assert started() == round_, lines
            # "connection closed" then "cannot connect" (a change): at most 2 lines per outage
            assert sum("warning: source:" in ln for ln in lines) <= 2 * round_, lines
            src.restart()
            wait_for(lambda: sum(f"recovered: source {src.tcp_address}" in ln for ln in lines) == round_,
                     timeout=30, what=f"recovery {round_} said: {lines}")
            http_post(src.http_address, "/pub", b"again%d" % round_, topic=topic)
            wait_for(lambda: b"again%d" % round_ in ep.bodies(), timeout=20, what="delivery after recovery")
    finally:
        p.terminate()
        p.wait(30)
        reader.join(5)
    assert p.returncode == 0, lines


def test_count_is_exact_with_many_requests_in_flight(nsqd, topic, endpoint):
    """-n 10 with 50 requests in flight against a slow endpoint: exactly 10 delivered (the
    requests already started when the 10th succeeded delivered 10 + dozens)."""
    ep = endpoint(lambda body, n: (200, {}, 0.3))
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%03d" % i for i in range(100)), topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url + "/x", "-n", "10", "--concurrency", "50",
                    "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(ep.requests) == 10 and b"delivered 10," in r.stderr, (len(ep.requests), r.stderr)
    assert chan(nsqd, topic)["depth"] == 90


# -- issue 33 -------------------------------------------------------------------------------------
def test_http_server_with_its_backlog_of_5_gets_every_message_in_seconds(nsqd, topic):
    """Python's http.server as dev and webhook servers run it: one request at a time, HTTP/1.0
    (it closes after each answer), listen backlog 5. to-http's connects beyond that backlog
    lost their SYNs and waited out the kernel's 1 s retry, four at a time: ~5-10 msg/s (1,000
    messages took minutes). Now every message arrives, each once, in seconds."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    got: list[bytes] = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()  # no Content-Length: the answer ends when it closes

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), H)
    assert server.request_queue_size == 5
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    bodies = [b"b%04d" % i for i in range(1000)]
    http_post(nsqd.http_address, "/mpub", b"\n".join(bodies), topic=topic)
    try:
        t0 = time.monotonic()
        r = run_nsqcli(["to-http", "-t", topic, "--post", f"http://127.0.0.1:{server.server_address[1]}/in",
                        "-n", "1000", "--nsqd-tcp-address", nsqd.tcp_address], timeout=120)
        took = time.monotonic() - t0
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    assert sorted(got) == bodies and b"delivered 1,000, failed attempts 0" in r.stderr
    c = chan(nsqd, topic)
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (0, 0, 0)
    assert took < 20, took  # ~1 s here; at the old ~10 msg/s, > 100 s


def test_timeout_is_the_whole_commands_deadline_with_a_hung_lookupd(cluster, topic, endpoint):
    """--timeout counts from process start: the lookup against a hung (SIGSTOPped) nsqlookupd
    spends it too - exit 3 at the deadline (5.2 s at --timeout 3s before)."""
    ep = endpoint()
    with stopped(cluster.lookupd):
        t0 = time.monotonic()
        r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url, "-n", "1", "--timeout", "3s",
                        "--lookupd-http-address", cluster.lookupd.http_address], timeout=60)
        took = time.monotonic() - t0
    err = r.stderr.decode()
    assert r.returncode == 3, err
    assert "--timeout passed while connecting" in err and "Traceback" not in err
    assert 2.9 < took < 3.8, took


def test_timeout_gives_up_requests_in_flight_and_requeues_them(nsqd, topic):
    """A server that takes connections and never answers: at --timeout the requests in flight
    are given up and their messages requeued at once - the command ends at its deadline (it
    waited --http-timeout, 20 s, and more before), and nothing is lost."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(50)  # the kernel accepts, nobody answers
    http_post(nsqd.http_address, "/mpub", b"a\nb\nc\nd\ne", topic=topic)
    try:
        t0 = time.monotonic()
        r = run_nsqcli(["to-http", "-t", topic, "--post", f"http://127.0.0.1:{silent.getsockname()[1]}/x",
                        "-n", "5", "--timeout", "2s", "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
        took = time.monotonic() - t0
    finally:
        silent.close()
    err = r.stderr.decode()
    assert r.returncode == 3, err
    assert "--timeout passed after 0 of 5 messages delivered" in err and "Traceback" not in err
    assert 1.9 < took < 2.8, took
    c = chan(nsqd, topic)  # all back in the queue at once, none counted as the endpoint's failure
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (5, 0, 5), c


def test_grep_and_where_deliver_only_the_matching_messages(nsqd, topic, endpoint):
    """--grep/--where: the matching messages are delivered, the others FINed undelivered and
    counted (the channel ends empty)."""
    import json

    ep = endpoint()
    bodies = [json.dumps({"type": "order" if i % 3 == 0 else "click", "n": i}).encode() for i in range(30)]
    http_post(nsqd.http_address, "/mpub", b"\n".join(bodies), topic=topic)
    r = run_nsqcli(["to-http", "-t", topic, "--post", ep.url, "--where", '.type == "order"', "--grep", "n",
                    "--idle-timeout", "1s", "--json", "--nsqd-tcp-address", nsqd.tcp_address], timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(ep.bodies()) == sorted(b for b in bodies if b'"order"' in b)
    doc = json.loads(r.stdout)
    assert (doc["delivered"], doc["filtered"]) == (10, 20)
    c = chan(nsqd, topic)
    assert c["depth"] == 0 and c["in_flight_count"] == 0 and c["message_count"] == 30
    # refused before anything starts (it started its HTTP delivery thread first: an in-process run
    # found the thread left running)
    bad = run_in_process(["to-http", "-t", topic, "--post", ep.url, "--where", ".type ==", "--nsqd-tcp-address",
                          nsqd.tcp_address])
    assert bad.returncode == 2 and bad.stderr.count(b"\n") == 1 and b"'--where'" in bad.stderr


# -- refusals: bad input, grammar (one line, exit 2, nothing delivered) ---------------------------------
from tests.support.refusals import bad_input, grammar_row, ids  # noqa: E402

BAD_INPUT = [
    (["to-http", "-t", "t"], 2, r"give --post URL or --get URL \(not both\)"),
    (["to-http", "-t", "t", "--get", "http://h/x"], 2, r"a --get URL needs exactly one %s"),
    (["to-http", "-t", "t", "--post", "http://h/", "--sample", "0"], 2, r"'--sample': 0\.0 is not in the range"),
    (["to-http", "-t", "t", "--post", "http://h/", "--http-timeout", "0"], 2, r"'--http-timeout': must be more than 0"),
    (["to-http", "-t", "t", "--post", "http://h/", "--header", "X-Name: 日本"], 2, r"HTTP headers are latin-1"),
    (["to-http", "-t", "t", "--post", "http://h/€"], 2, r"percent-encode what is not ASCII"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["to-http", "a", "-t", "b", "--post", "http://127.0.0.1:1/"], 2, r"TOPIC given twice"),
    (["to-http", "a", "c", "-c", "d", "--post", "http://127.0.0.1:1/"], 2, r"CHANNEL given twice"),
    (["to-http", "--post", "http://127.0.0.1:1/"], 2, r"missing TOPIC \(nsqcli to-http TOPIC \[CHANNEL\]"),
    (["to-http", "x", "--timeout", "0"], 2, r"'--timeout': must be more than 0"),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)
