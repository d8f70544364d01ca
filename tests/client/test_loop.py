"""The I/O loop that drives every connection of a process (nsqcli.client.loop): what one
connection, one callback or one close must never do to the others. Found by a cold review
of the loop; each test failed on the first version of it."""

from __future__ import annotations

import json
import os
import threading
import time
import zlib

from tests.support.fakes import FakeNsqd
from tests.support.hung import cluster, stopped  # noqa: F401 - cluster: the fixture
from tests.support.helpers import Collector, wait_for

from nsqcli import Config, Consumer, Producer
from nsqcli.client.conn import Connection, ConnectionDelegate
from nsqcli.client.transport import MAX_DECOMPRESSED, _Deflate


def test_a_callback_that_raises_does_not_stop_the_loop(nsqd, topic):
    """A consumer's on_error raises (a user's bug, or a write to a closed stderr) when its
    refused nsqd fails again - on the loop: the loop logs it and every other connection goes on."""
    got = Collector(2)
    healthy = Consumer(topic, "c", got, nsqd_tcp_addresses=[nsqd.tcp_address]).start()

    def bad_on_error(err):
        raise RuntimeError("callback bug")

    broken = Consumer(topic + "_x", "c", lambda m: None, nsqd_tcp_addresses=[nsqd.tcp_address, "127.0.0.1:1"],
                      config=Config(reconnect_min_delay=0.05, reconnect_max_delay=0.1), on_error=bad_on_error)
    try:
        broken.start()
        with Producer(nsqd.tcp_address) as p:
            p.publish(topic, b"before")
            time.sleep(0.5)  # several refused reconnects, each raising in the callback
            p.publish(topic, b"after")
        assert got.done.wait(5), got.bodies
        assert got.bodies == [b"before", b"after"]
    finally:
        broken.stop(2)
        healthy.stop(2)


def test_close_while_the_last_handshake_reply_is_in_flight_closes():
    """close() right when the handshake's last reply is in the socket (the loop reads it before
    it runs the abort): the connection still ends closed, not connected for good."""
    got_identify, go = threading.Event(), threading.Event()

    def script(peer):
        peer.magic()
        peer.until(b"IDENTIFY")
        got_identify.set()
        go.wait(5)
        peer.respond(json.dumps({"max_rdy_count": 2500, "version": "fake", "msg_timeout": 60000}).encode())
        peer.silence(10)

    with FakeNsqd(script) as srv:
        c = Connection(srv.address, Config(), ConnectionDelegate())
        c.begin()
        assert got_identify.wait(5)
        c._loop.call(lambda: time.sleep(0.5))  # the loop is busy (other connections) ...
        time.sleep(0.05)
        go.set()                                # ... while the reply arrives
        time.sleep(0.1)
        t0 = time.monotonic()
        c.close(2.0)
        assert c.state == "closed" and c.closed_event.is_set()
        assert time.monotonic() - t0 < 1.5


def test_producer_close_answers_every_future_within_its_timeout():
    """A peer that takes PUBs and never answers: close(1.0) returns within its timeout with
    every future answered (a TransportError), not left to the linger after it."""
    def script(peer):
        peer.handshake()
        while True:
            peer.command()

    with FakeNsqd(script) as srv:
        p = Producer(srv.address)
        futs = [f for i in range(5) for f in p.publish_async("t", b"x%d" % i)]
        t0 = time.monotonic()
        p.close(timeout=1.0)
        assert time.monotonic() - t0 < 1.6
        assert all(f.done() for f in futs)


def test_a_long_deflate_match_cut_at_the_output_limit_is_not_held_back():
    """A read that ends right after a long match crossing the 1 MiB output cap: zlib holds the
    rest inside itself with no input left over - the stream must still say it has more, or
    the end of the frame waits for the next heartbeat."""
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    plain = b"\0" * (MAX_DECOMPRESSED + 5000) + os.urandom(100) + b"\0" * 3000
    wire = comp.compress(plain) + comp.flush(zlib.Z_SYNC_FLUSH)
    for cut in range(1, len(wire)):
        want = len(zlib.decompressobj(-15).decompress(wire[:cut]))
        d = _Deflate(6)
        got = len(d.decompress(wire[:cut]))
        while d.has_more():
            got += len(d.decompress(b""))
        assert got == want, cut


def test_a_forked_child_publishes_on_its_own_connection(nsqd, topic):
    """The parent's Producer used in a child after os.fork: the loop driving its connection is
    not in the child, so the child connects again instead of waiting for an answer that
    never comes."""
    with Producer(nsqd.tcp_address) as p:
        p.publish(topic, b"parent")
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                p.publish(topic, b"child", timeout=3)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        p.publish(topic, b"parent again")
    got = Collector(3)
    c = Consumer(topic, "c", got, nsqd_tcp_addresses=[nsqd.tcp_address]).start()
    try:
        assert got.done.wait(5), got.bodies
        assert sorted(got.bodies) == [b"child", b"parent", b"parent again"]
    finally:
        c.stop(2)


def test_stop_with_hung_nodes_costs_one_deadline_not_one_per_node(cluster, topic):
    """Three connected nsqd hang (SIGSTOP) before stop(): the CLOSE_WAITs are waited for once
    for all of them (5 s) and the connections close side by side - not 5 s + 2 s per node."""
    c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[n.tcp_address for n in cluster.nsqds]).start()
    assert len(c.connections) == 3
    with stopped(*cluster.nsqds):
        t0 = time.monotonic()
        c.stop(30)
        took = time.monotonic() - t0
    assert took < 9, took  # one after another: 21 s
    assert c.connections == []
