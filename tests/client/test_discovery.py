"""nsqlookupd discovery on real nsqlookupd/nsqd: add, kill, restart, deleted topics."""

from __future__ import annotations

import threading
import time

from tests.support.helpers import Collector, channel_stats, http_post, lookup_producers, topic_stats, wait_for

from nsqcli import Config, Consumer


# 10, 11 -------------------------------------------------------------------------------------------
def test_deleted_topic_does_not_come_back(nsqd, lookupd, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    wait_for(lambda: lookup_producers(lookupd, topic), what="registered")
    c = Consumer(topic, "c", lambda m: None, lookupd_http_addresses=[lookupd.http_address],
                 config=Config(reconnect_min_delay=0.3), on_error=lambda e: None)
    c.start()
    try:
        wait_for(lambda: channel_stats(nsqd, topic, "c") is not None, what="subscribed")
        http_post(nsqd.http_address, "/topic/delete", topic=topic)
        wait_for(lambda: not c.connections, what="connection closed by the deletion")
        time.sleep(2.5)  # several quick re-polls of lookupd happen in this time
        assert topic_stats(nsqd, topic) is None, "the consumer's SUB re-created the deleted topic"
    finally:
        c.stop()


def test_rediscovery_after_nsqd_restart_takes_seconds_not_a_minute(sandbox, lookupd, extra_nsqd, topic):
    server = extra_nsqd()
    http_post(server.http_address, "/topic/create", topic=topic)
    wait_for(lambda: lookup_producers(lookupd, topic), what="registered")
    got = []
    c = Consumer(topic, "c", lambda m: got.append(m.body), lookupd_http_addresses=[lookupd.http_address],
                 config=Config(lookupd_poll_interval=60), on_error=lambda e: None)
    c.start()
    try:
        assert c.connections == [server.tcp_address]
        before = c._links[server.tcp_address]
        server.restart()
        t0 = time.monotonic()
        # a new connection (the address alone is still listed until the old one's loss is noticed)
        wait_for(lambda: c._links.get(server.tcp_address) not in (None, before), timeout=20, what="reconnected")
        back_after = time.monotonic() - t0
        assert back_after < 20  # a regular poll would take 42-78 s
        http_post(server.http_address, "/pub", b"after restart", topic=topic)
        wait_for(lambda: b"after restart" in got, what="a message after the restart")
    finally:
        c.stop()


def test_lookupd_discovery_add_kill_restart(sandbox, nsqd, lookupd, extra_nsqd, topic):
    second = extra_nsqd()
    for s in (nsqd, second):
        http_post(s.http_address, "/topic/create", topic=topic)
    wait_for(lambda: len(lookup_producers(lookupd, topic)) == 2,
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


def test_discovery_knows_its_consumer_only_through_the_callbacks_it_is_given(nsqd, lookupd, topic):
    """No Consumer here: a lookupd poll asks connect() for each producer that connected() does
    not list, a dead lookupd goes to report(), and a producer already connected is left alone."""
    import random

    from nsqcli.client.discovery import Discovery

    http_post(nsqd.http_address, "/topic/create", topic=topic)
    wait_for(lambda: lookup_producers(lookupd, topic), what="registered")
    asked, reported, connected = [], [], set()
    d = Discovery(topic, ["127.0.0.1:1", lookupd.http_address], [], Config(lookupd_poll_timeout=2.0),
                  lock=threading.RLock(), rng=random.Random(1),
                  connect=lambda address, direct, report=True, deadline=None: asked.append((address, direct)),
                  connected=lambda: connected, stopping=lambda: False, report=reported.append)
    errors = d.poll_lookupd(report=True)
    assert asked == [(nsqd.tcp_address, False)]
    assert len(errors) == 1 and "127.0.0.1:1" in str(errors[0]) and reported == errors
    connected.add(nsqd.tcp_address)
    asked.clear()
    assert d.poll_lookupd(report=False) and asked == []  # the dead lookupd again, and nothing to dial
