"""The client core against REAL nsqd/nsqlookupd: round trips, TLS, compression, AUTH, discovery,
RDY and backoff as nsqd's /stats sees them, attempts, heartbeats."""

from __future__ import annotations

import threading
import time

import pytest

from helpers import channel_stats, http_get_json, http_post, wait_for
from nsq_fixtures import AuthServer, make_cert
from nsqcli import Config, Consumer, Producer
from nsqcli.client.config import TLSConfig
from nsqcli.errors import (AuthError, BadTopicError, ConnectError, PublishError, ServerError,
                           TransportError)


class Collector:
    def __init__(self, want: int):
        self.want = want
        self.msgs = []
        self.done = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, m):
        with self.lock:
            self.msgs.append((m.body, m.attempts, m.nsqd, m.id))
            if len(self.msgs) >= self.want:
                self.done.set()

    @property
    def bodies(self):
        return [b for b, *_ in self.msgs]


def consume(topic, want, addresses=(), lookupds=(), channel="c", timeout=20, **cfg):
    col = Collector(want)
    c = Consumer(topic, channel, col, nsqd_tcp_addresses=list(addresses),
                 lookupd_http_addresses=list(lookupds), config=Config(**cfg))
    c.start()
    try:
        assert col.done.wait(timeout), f"got {len(col.msgs)} of {want}"
    finally:
        c.stop()
    return col


BODIES = [b"plain", b"with\nnewline", bytes(range(256)), b"\x00" * 10, "é✓".encode(), b"x" * 100_000]


def test_pub_mpub_dpub_round_trip(nsqd, topic):
    with Producer(nsqd.tcp_address) as p:
        assert p.publish(topic, b"one") == [nsqd.tcp_address]
        res = p.multi_publish(topic, BODIES)
        assert res.published == len(BODIES)
        t0 = time.monotonic()
        p.publish(topic, b"deferred", defer=1.0)
    col = consume(topic, 2 + len(BODIES), [nsqd.tcp_address], max_in_flight=50)
    assert sorted(col.bodies) == sorted([b"one", b"deferred"] + BODIES)
    assert col.bodies[-1] == b"deferred" and time.monotonic() - t0 >= 1.0
    assert channel_stats(nsqd, topic, "c")["depth"] == 0


def test_publish_errors_are_typed(nsqd, topic):
    with Producer(nsqd.tcp_address, Config(max_msg_size=10 * 1024 * 1024)) as p:
        with pytest.raises(BadTopicError) as e:  # bypass local validation: nsqd says no
            conn = p._active_link()
            p._wait(p._send(conn, b"PUB bad!topic\n\x00\x00\x00\x01x"), 5, conn)
        assert e.value.code == "E_BAD_TOPIC"
        with pytest.raises(PublishError, match="published 0 of 1 messages") as e:
            p.multi_publish(topic, [b"y" * (2 * 1024 * 1024)])  # over nsqd's 1 MiB max-msg-size
        assert isinstance(e.value.cause, ServerError) and e.value.cause.code == "E_BAD_MESSAGE"
    with pytest.raises(PublishError, match="connection refused|cannot connect"):
        Producer("127.0.0.1:1").publish(topic, b"x")


def test_failover_and_fanout(nsqd, extra_nsqd, topic):
    other = extra_nsqd()
    with Producer(["127.0.0.1:1", other.tcp_address]) as p:
        assert p.publish(topic, b"failover") == [other.tcp_address]
    with Producer([nsqd.tcp_address, other.tcp_address], fanout=True) as p:
        assert p.publish(topic, b"both") == [nsqd.tcp_address, other.tcp_address]
    assert http_get_json(nsqd.http_address, "/stats", format="json", topic=topic)["topics"][0]["message_count"] == 1
    assert http_get_json(other.http_address, "/stats", format="json", topic=topic)["topics"][0]["message_count"] == 2


@pytest.mark.parametrize("feature", ["snappy", "deflate"])
def test_compression(nsqd, topic, feature):
    cfg = {feature: True}
    with Producer(nsqd.tcp_address, Config(**cfg)) as p:
        p.multi_publish(topic, BODIES * 20)
        stats = http_get_json(nsqd.http_address, "/stats", format="json")
        assert any(pr[feature] for pr in stats["producers"])
    col = consume(topic, len(BODIES) * 20, [nsqd.tcp_address], max_in_flight=100, **cfg)
    assert sorted(col.bodies) == sorted(BODIES * 20)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    return make_cert(d, "server"), make_cert(d, "other")


def test_tls_verified(nsqd_factory, certs, topic):
    (cert, key), (other_cert, _) = certs
    server = nsqd_factory(tls_cert=cert, tls_key=key)
    tls = TLSConfig(enabled=True, ca_file=cert)
    with Producer(server.tcp_address, Config(tls=tls, snappy=True)) as p:
        p.multi_publish(topic, BODIES)
        clients = http_get_json(server.http_address, "/stats", format="json")["producers"]
        assert clients[0]["tls"] and clients[0]["snappy"] and clients[0]["tls_version"].startswith("TLS")
    col = consume(topic, len(BODIES), [server.tcp_address], tls=tls, deflate=True)
    assert sorted(col.bodies) == sorted(BODIES)
    # a wrong CA is refused with a clear error
    with pytest.raises(PublishError, match="TLS certificate verification failed"):
        Producer(server.tcp_address, Config(tls=TLSConfig(enabled=True, ca_file=other_cert))).publish(topic, b"x")
    # ... unless verification is explicitly skipped
    with Producer(server.tcp_address, Config(tls=TLSConfig(enabled=True, insecure_skip_verify=True))) as p:
        p.publish(topic, b"insecure")
    # TLS asked from a server without it
    with pytest.raises(PublishError, match="does not offer it"):
        Producer(nsqd_factory().tcp_address, Config(tls=tls)).publish(topic, b"x")


def test_auth(nsqd_factory, topic):
    grants = {"all": [(".*", [".*"], ["subscribe", "publish"])],
              "pub": [(topic, [".*"], ["publish"])]}
    with AuthServer(grants) as auth:
        server = nsqd_factory(auth_http_address=auth.address)
        with Producer(server.tcp_address, Config(auth_secret="all")) as p:
            p.publish(topic, b"authed")
            assert p._links[server.tcp_address].auth_info["identity"] == "user-all"
        col = consume(topic, 1, [server.tcp_address], auth_secret="all")
        assert col.bodies == [b"authed"]
        with pytest.raises(PublishError) as e:  # wrong secret
            Producer(server.tcp_address, Config(auth_secret="nope")).publish(topic, b"x")
        assert isinstance(e.value.cause, AuthError) and "E_AUTH_FAILED" in str(e.value)
        with pytest.raises(PublishError, match="requires authentication"):  # no secret
            Producer(server.tcp_address).publish(topic, b"x")
        # allowed to publish, denied to subscribe
        Producer(server.tcp_address, Config(auth_secret="pub")).publish(topic, b"ok")
        c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[server.tcp_address],
                     config=Config(auth_secret="pub"))
        with pytest.raises(AuthError, match="E_UNAUTHORIZED"):
            c.start()
        assert {call["secret"] for call in auth.calls} >= {"all", "nope", "pub"}


def test_sample_rate(nsqd, topic):
    with Producer(nsqd.tcp_address) as p:
        p.multi_publish(topic, [b"%d" % i for i in range(2000)])
    got = []
    c = Consumer(topic, "c", lambda m: got.append(m.body), nsqd_tcp_addresses=[nsqd.tcp_address],
                 config=Config(max_in_flight=200, sample_rate=25))
    c.start()
    wait_for(lambda: channel_stats(nsqd, topic, "c")["depth"] == 0 and
             channel_stats(nsqd, topic, "c")["in_flight_count"] == 0, what="channel drained")
    c.stop()
    assert 300 < len(got) < 700, len(got)  # nsqd delivers ~25 % and drops the rest


def test_lookupd_discovery_add_kill_restart(sandbox, nsqd, lookupd, extra_nsqd, topic):
    second = extra_nsqd()
    for s in (nsqd, second):
        http_post(s.http_address, "/topic/create", topic=topic)
    wait_for(lambda: len(http_get_json(lookupd.http_address, "/lookup", topic=topic)["producers"]) == 2,
             what="two producers registered")
    got = Collector(10 ** 9)
    c = Consumer(topic, "c", got, lookupd_http_addresses=["127.0.0.1:1", lookupd.http_address],
                 config=Config(max_in_flight=10, lookupd_poll_interval=0.5, lookupd_poll_jitter=0.1))
    errors = []
    c._report = errors.append
    c.start()
    try:
        assert sorted(c.connections) == sorted([nsqd.tcp_address, second.tcp_address])
        assert any("127.0.0.1:1" in str(e) for e in errors)  # the dead lookupd is reported, not fatal
        third = extra_nsqd()
        http_post(third.http_address, "/topic/create", topic=topic)
        wait_for(lambda: third.tcp_address in c.connections, what="third nsqd discovered")
        second.kill()
        wait_for(lambda: second.tcp_address not in c.connections, what="killed node dropped")
        second.restart()
        wait_for(lambda: second.tcp_address in c.connections, timeout=15, what="restarted node reconnected")
        for s in (nsqd, second, third):
            http_post(s.http_address, "/pub", s.tcp_address.encode(), topic=topic)
        wait_for(lambda: len(got.msgs) >= 3, what="a message from each node")
        assert {m[2] for m in got.msgs} == {nsqd.tcp_address, second.tcp_address, third.tcp_address}
    finally:
        c.stop()


def ready_counts(servers, topic, channel="c"):
    out = []
    for s in servers:
        ch = channel_stats(s, topic, channel)
        out += [cl["ready_count"] for cl in (ch or {}).get("clients") or []]
    return out


def test_rdy_never_above_max_in_flight(nsqd, extra_nsqd, topic):
    servers = [nsqd, extra_nsqd(), extra_nsqd()]
    for s in servers:
        http_post(s.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(300)), topic=topic)
    gate = threading.Event()
    got = []

    def slow(m):
        gate.wait()
        got.append(m.body)

    c = Consumer(topic, "c", slow, nsqd_tcp_addresses=[s.tcp_address for s in servers],
                 config=Config(max_in_flight=7, rdy_redistribute_interval=0.2))
    c.start()
    try:
        for _ in range(20):
            counts = ready_counts(servers, topic)
            assert sum(counts) <= 7, counts
            time.sleep(0.05)
        wait_for(lambda: sorted(ready_counts(servers, topic)) == [2, 2, 3], what="remainder kept")
        gate.set()
        wait_for(lambda: len(got) == 900, timeout=30, what="all messages")
    finally:
        gate.set()
        c.stop()


def test_fewer_in_flight_than_nodes_receives_from_all(nsqd, extra_nsqd, topic):
    servers = [nsqd, extra_nsqd(), extra_nsqd()]
    for s in servers:
        http_post(s.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(20)), topic=topic)
    col = Collector(60)
    c = Consumer(topic, "c", col, nsqd_tcp_addresses=[s.tcp_address for s in servers],
                 config=Config(max_in_flight=1, rdy_redistribute_interval=0.1,
                               low_rdy_idle_timeout=0.2, low_rdy_timeout=0.3))
    c.start()
    try:
        for _ in range(40):
            assert sum(ready_counts(servers, topic)) <= 1
            time.sleep(0.02)
        assert col.done.wait(30), len(col.msgs)
    finally:
        c.stop()
    assert {m[2] for m in col.msgs} == {s.tcp_address for s in servers}


def test_backoff_visible_in_stats(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(50)), topic=topic)
    fail = threading.Event()
    fail.set()
    handled = []

    def handler(m):
        handled.append((time.monotonic(), m.body))
        if fail.is_set():
            raise RuntimeError("boom")
        if c.flow.level > 0:
            time.sleep(0.4)  # keep the test-the-water RDY 1 visible to /stats for a while

    c = Consumer(topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp_address],
                 config=Config(max_in_flight=10, backoff_multiplier=0.25, max_backoff_duration=2.0,
                               default_requeue_delay=0))
    c._report = lambda e: None
    c.start()
    try:
        wait_for(lambda: ready_counts([nsqd], topic) == [0], what="RDY 0 during backoff")
        assert c.flow.level >= 1
        fail.clear()
        wait_for(lambda: ready_counts([nsqd], topic) == [1], what="RDY 1 to test the water")
        wait_for(lambda: ready_counts([nsqd], topic) == [10], timeout=15, what="back to full speed")
        assert c.flow.level == 0
        wait_for(lambda: channel_stats(nsqd, topic, "c")["depth"] == 0 and
                 channel_stats(nsqd, topic, "c")["in_flight_count"] == 0, timeout=20, what="drained")
        assert channel_stats(nsqd, topic, "c")["requeue_count"] >= 1
    finally:
        c.stop()


def test_max_attempts_gives_up(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"poison", topic=topic)
    seen, given_up = [], []
    done = threading.Event()

    def handler(m):
        seen.append(m.attempts)
        m.requeue(delay=0, backoff=False)

    def give_up(m):
        given_up.append((m.body, m.attempts))
        done.set()

    c = Consumer(topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp_address], on_give_up=give_up,
                 config=Config(max_in_flight=1, max_attempts=3))
    c.start()
    try:
        assert done.wait(10)
        assert seen == [1, 2, 3] and given_up == [(b"poison", 4)]
        wait_for(lambda: channel_stats(nsqd, topic, "c")["depth"] == 0 and
                 channel_stats(nsqd, topic, "c")["in_flight_count"] == 0, what="FINed after give-up")
    finally:
        c.stop()


def test_heartbeats_answered_while_handler_is_slow(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"a\nb", topic=topic)
    got = []

    def slow(m):
        time.sleep(2.5)  # longer than 2 heartbeat intervals
        m.touch()
        got.append(m.body)

    c = Consumer(topic, "c", slow, nsqd_tcp_addresses=[nsqd.tcp_address],
                 config=Config(max_in_flight=2, heartbeat_interval=1.0))
    c.start()
    try:
        wait_for(lambda: len(got) == 2, timeout=10, what="both messages")
        assert c.connections == [nsqd.tcp_address]  # still connected: heartbeats were answered
        (snap,) = c.stats()
        assert snap.finished == 2
        assert c._handles[nsqd.tcp_address].conn.heartbeats >= 3  # nsqd sent them, we answered NOP
    finally:
        c.stop()


def test_stop_leaves_no_thread(nsqd, topic):
    before = set(threading.enumerate())
    c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[nsqd.tcp_address],
                 lookupd_http_addresses=[], config=Config(max_in_flight=5))
    c.start()
    c.stop()
    time.sleep(0.1)
    assert set(threading.enumerate()) - before == set()


def test_direct_nsqd_reconnects_with_backoff(nsqd_factory, topic):
    server = nsqd_factory()
    got = Collector(1)
    c = Consumer(topic, "c", got, nsqd_tcp_addresses=[server.tcp_address],
                 config=Config(max_in_flight=5, reconnect_min_delay=0.2, reconnect_max_delay=1.0))
    c._report = lambda e: None
    c.start()
    try:
        server.kill()
        wait_for(lambda: c.connections == [], what="disconnect noticed")
        server.restart()
        wait_for(lambda: c.connections == [server.tcp_address], timeout=15, what="reconnected")
        http_post(server.http_address, "/pub", b"after restart", topic=topic)
        assert got.done.wait(10)
    finally:
        c.stop()


def test_start_fails_fast_with_clear_error(topic):
    c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=["127.0.0.1:1"])
    c._report = lambda e: None
    with pytest.raises(ConnectError, match="127.0.0.1:1: cannot connect"):
        c.start()
    with pytest.raises(TransportError):
        Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=["127.0.0.1:1"]).start()


def test_tls_client_certificate_required(nsqd_factory, certs, tmp_path, topic):
    """nsqd --tls-client-auth-policy=require-verify: only a client with a certificate it trusts."""
    (cert, key), _ = certs
    client_cert, client_key = make_cert(tmp_path, "client")
    server = nsqd_factory(tls_cert=cert, tls_key=key, tls_root_ca_file=client_cert,
                          tls_client_auth_policy="require-verify", tls_required=True)
    ok = TLSConfig(enabled=True, ca_file=cert, cert_file=client_cert, key_file=client_key, min_version="1.2")
    with Producer(server.tcp_address, Config(tls=ok)) as p:
        p.publish(topic, b"mutual")
        (client,) = http_get_json(server.http_address, "/stats", format="json")["producers"]
        assert client["tls"] and client["tls_version"] in ("TLS1.2", "TLS1.3")
    with pytest.raises(PublishError):
        Producer(server.tcp_address, Config(tls=TLSConfig(enabled=True, ca_file=cert))).publish(topic, b"x")


def test_lookupd_pre_1_0_envelope_is_unwrapped():
    """Servers <= v0.3.8 wrap JSON as {status_code, status_txt, data} unless they honour the
    Accept header; such a server cannot be built here, so one answer of that shape is served."""
    import json as _json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from nsqcli.client.http import lookup_topic

    class Old(BaseHTTPRequestHandler):
        def do_GET(self):
            body = _json.dumps({"status_code": 200, "status_txt": "OK", "data": {"channels": ["c"], "producers": [
                {"broadcast_address": "10.0.0.5", "hostname": "old", "tcp_port": 4150, "http_port": 4151,
                 "version": "0.3.8"}]}}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Old)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        (p,) = lookup_topic(f"127.0.0.1:{srv.server_address[1]}", "t")
        assert (p.tcp_address, p.version) == ("10.0.0.5:4150", "0.3.8")
    finally:
        srv.shutdown()
        srv.server_close()
