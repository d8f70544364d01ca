"""The Consumer on real nsqd: RDY, backoff, FIN/REQ/TOUCH, held batches, stop."""

from __future__ import annotations

import pickle
import threading
import time

from tests.support.fakes import FRAME_RESPONSE, FakeLookupd, FakeNsqd, MemoryStream, frame, message
from tests.support.helpers import Collector, channel_stats, drained, http_post, wait_for

from nsqcli import Config, Consumer, Producer
from nsqcli.protocol import MessageData


def io_threads() -> list[str]:
    """A consumer's own threads (its handler pool; loops, timers and blocking-call threads are
    the process's, shared)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("nsqcli-handler")]




def ready_counts(servers, topic, channel="c"):
    out = []
    for s in servers:
        ch = channel_stats(s, topic, channel)
        out += [cl["ready_count"] for cl in (ch or {}).get("clients") or []]
    return out


def settled_ready_counts(servers, topic, channel="c"):
    """ready_counts read twice in a row until both reads agree: one read asks the nodes one after
    another, so a RDY moved from the first node to the last while it asks is counted on both
    (a clean-clone CI run saw [1, 0, 1] with max_in_flight 1). Two equal reads are a state the
    nodes were in together."""
    last = ready_counts(servers, topic, channel)
    for _ in range(50):
        now = ready_counts(servers, topic, channel)
        if now == last:
            return now
        last = now
    raise AssertionError(f"RDY never held still over two reads: {last}")


def test_non_fatal_error_frames_keep_the_connection_and_are_counted(nsqd_factory, topic):
    """A handler slower than --msg-timeout: nsqd answers the FIN with E_FIN_FAILED. The
    connection stays, the error is counted as timed out and reported to on_error (1 argument).
    (Its own nsqd, and several slow messages: nsqd re-reads its channel list for timeout scans
    every 5 s, so a new channel's first timeouts can take that long to be noticed.)"""
    nsqd = nsqd_factory()
    with Producer(nsqd.tcp_address) as p:
        p.multi_publish(topic, [b"slow-%d" % i for i in range(5)])
    reported = []
    done = threading.Event()

    def handler(m):
        time.sleep(2.5)  # over the 1 s message timeout asked for below
        if m.attempts >= 2:
            done.set()

    c = Consumer(topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp_address], on_error=reported.append,
                 config=Config(max_in_flight=1, msg_timeout=1.0, max_backoff_duration=0))
    c.start()
    try:
        conn = c._links[nsqd.tcp_address].conn
        wait_for(lambda: c.totals()["timed_out"] >= 1, timeout=30, what="an E_FIN_FAILED counted")
        assert c._links[nsqd.tcp_address].conn is conn and conn.alive  # same connection, alive
        assert any(getattr(e, "code", "") == "E_FIN_FAILED" for e in reported), reported
        assert not any(isinstance(e, TypeError) for e in reported)
        assert c.stats()[0].timed_out >= 1
        clients = channel_stats(nsqd, topic, "c")["clients"]
        assert len(clients) == 1
    finally:
        c.stop()


def test_messages_in_the_same_read_as_subs_ok_are_delivered_at_once():
    """Through a memory stream (no socket): SUB's OK and two messages arrive in ONE read; both
    reach poll() without any further data."""
    stream = MemoryStream()
    c = Consumer("t", "c", pull=True, nsqd_tcp_addresses=["memory:1"], dial=MemoryStream.dialer([stream]),
                 config=Config(max_in_flight=5, heartbeat_interval=0, read_timeout=30))
    stream.feed(frame(FRAME_RESPONSE, b"OK"))  # IDENTIFY
    stream.feed(frame(FRAME_RESPONSE, b"OK") + message(b"first", b"a" * 16) + message(b"second", b"b" * 16))
    c.start()
    try:
        got = c.poll(10, timeout=2.0)
        got += c.poll(10, timeout=0.5) if len(got) < 2 else []
        assert [m.body for m in got] == [b"first", b"second"]
        assert stream.sent.startswith(b"  V2IDENTIFY\n") and b"SUB t c\n" in stream.sent
        assert c.finish_many(got) == []
        stream.wait_sent(b"FIN " + b"a" * 16 + b"\nFIN " + b"b" * 16 + b"\n")
    finally:
        stream.feed(None)
        c.stop(timeout=2)


def test_stop_during_a_reconnect_leaks_nothing():
    """The first connection is dropped; the reconnect's handshake is stalled by the server when
    stop() is called: stop returns promptly, and no connection or I/O thread is left behind."""
    release = threading.Event()
    closed = threading.Event()

    def script(peer):
        if peer.server.connections == 1:
            peer.handshake()
            peer.respond(b"OK")
            peer.sock.close()
            return
        peer.magic()
        peer.until(b"IDENTIFY")
        release.wait(10)
        try:
            peer.respond(b"OK")
            peer.until(b"SUB")
            peer.respond(b"OK")
            while peer.command():
                pass
        except (EOFError, OSError):
            closed.set()

    before = set(io_threads())
    with FakeNsqd(script) as fake:
        c = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=[fake.address],
                     config=Config(reconnect_min_delay=0.1), on_error=lambda e: None)
        c.start()
        wait_for(lambda: fake.connections == 2, what="the reconnect in progress")
        time.sleep(0.2)
        t0 = time.monotonic()
        threading.Timer(0.05, release.set).start()  # the handshake completes during stop()
        c.stop(timeout=5)
        assert time.monotonic() - t0 < 5
        assert not c.connections
        wait_for(lambda: set(io_threads()) <= before, timeout=5, what="no thread left")
        wait_for(closed.is_set, timeout=5, what="the server sees the connection closed")


def test_backoff_timer_runs_while_lookupd_hangs(nsqd, topic):
    """A handler failure starts a short backoff; a lookupd that never answers (the discovery
    thread is stuck in it) must not stretch the backoff: the retry arrives on time."""
    def silent(peer):
        from tests.support.fakes import http_request

        http_request(peer)
        peer.silence()

    with Producer(nsqd.tcp_address) as p:
        p.publish(topic, b"fail once")
    seen = []

    def handler(m):
        seen.append(time.monotonic())
        if m.attempts == 1:
            raise RuntimeError("first attempt fails")

    with FakeLookupd(silent) as fake:
        c = Consumer(topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp_address],
                     lookupd_http_addresses=[fake.address], on_error=lambda e: None,
                     config=Config(max_in_flight=1, backoff_multiplier=0.2, default_requeue_delay=0,
                                   lookupd_poll_interval=0.1, lookupd_poll_timeout=5.0))
        c.start(fail_fast=False)
        try:
            wait_for(lambda: len(seen) >= 2, timeout=15, what="the retry after the backoff")
            assert seen[1] - seen[0] < 3.0  # backoff 0.4 s; a lookupd poll blocks for 5 s
        finally:
            c.stop(timeout=10)


def test_fin_on_a_dead_connection_is_counted_lost_not_finished(nsqd_factory, topic):
    server = nsqd_factory()
    with Producer(server.tcp_address) as p:
        p.multi_publish(topic, [b"m%d" % i for i in range(5)])
    c = Consumer(topic, "c", pull=True, nsqd_tcp_addresses=[server.tcp_address], on_error=lambda e: None,
                 config=Config(max_in_flight=10, reconnect_min_delay=30))
    c.start()
    try:
        got = []
        wait_for(lambda: got.extend(c.poll(10, timeout=0.2)) or len(got) == 5, what="5 held messages")
        server.kill()
        wait_for(lambda: not c.connections, what="the connection lost")
        lost = c.finish_many(got)
        assert lost == got
        t = c.totals()
        assert t["lost_responses"] == 5
        assert sum(s.finished for s in c.stats()) == 0
    finally:
        c.stop(timeout=5)


# seams --------------------------------------------------------------------------------------------
def test_held_batches_finish_requeue_touch_on_real_nsqd(nsqd, topic):
    with Producer(nsqd.tcp_address) as p:
        p.multi_publish(topic, [b"h%d" % i for i in range(30)])
    c = Consumer(topic, "c", pull=True, nsqd_tcp_addresses=[nsqd.tcp_address],
                 config=Config(max_in_flight=20, msg_timeout=1.0, touch_interval=0.3))
    c.start()
    try:
        batch = []
        wait_for(lambda: batch.extend(c.poll(20 - len(batch), timeout=0.2)) or len(batch) == 20,
                 what="20 held messages")
        assert c.poll(5, timeout=0.3) == []  # bounded by max_in_flight: nsqd sends no more
        assert c.held == 20
        time.sleep(2.0)  # twice the message timeout: the TOUCHes keep them ours
        ch = channel_stats(nsqd, topic, "c")
        assert ch["timeout_count"] == 0 and ch["in_flight_count"] == 20
        assert c.requeue_many(batch[:5]) == []
        assert c.finish_many(batch[5:]) == []
        wait_for(lambda: channel_stats(nsqd, topic, "c")["requeue_count"] == 5, what="5 requeued")
        rest = []
        wait_for(lambda: rest.extend(c.poll(20, timeout=0.2)) or len(rest) == 15, what="the other 15")
        c.finish_many(rest)
        wait_for(lambda: channel_stats(nsqd, topic, "c")["depth"] == 0
                 and channel_stats(nsqd, topic, "c")["in_flight_count"] == 0, what="all done")
        assert c.held == 0
    finally:
        c.stop()


def test_held_messages_are_touched_from_arrival_and_warn_near_max_msg_timeout(nsqd_factory, topic, caplog):
    """Messages nobody has polled yet are kept alive too (a Spark source takes them only when the
    engine asks); past 80 % of nsqd's --max-msg-timeout a warning says TOUCH can no longer help."""
    import logging

    server = nsqd_factory(extra_args=["--max-msg-timeout=4s"])
    with Producer(server.tcp_address) as p:
        p.multi_publish(topic, [b"w%d" % i for i in range(10)])
    c = Consumer(topic, "c", pull=True, nsqd_tcp_addresses=[server.tcp_address],
                 config=Config(max_in_flight=10, msg_timeout=1.0, touch_interval=0.3))
    caplog.set_level(logging.WARNING, logger="nsqcli.client.consumer")
    c.start()
    try:
        wait_for(lambda: c.held == 10, what="10 messages arrived (not polled)")
        time.sleep(2.5)  # 2.5x msg_timeout, nothing polled: still ours
        ch = channel_stats(server, topic, "c")
        assert ch["timeout_count"] == 0 and ch["in_flight_count"] == 10
        wait_for(lambda: "nearing nsqd's max_msg_timeout" in caplog.text, timeout=5, what="the warning")
        c.finish_many(c.poll(10, timeout=1))
    finally:
        c.stop()


def test_messages_pickle_as_plain_data(nsqd, topic):
    with Producer(nsqd.tcp_address) as p:
        p.publish(topic, b"\x00binary\xff")
    c = Consumer(topic, "ch", pull=True, nsqd_tcp_addresses=[nsqd.tcp_address])
    c.start()
    try:
        got = []
        wait_for(lambda: got.extend(c.poll(1, timeout=0.2)) or got, what="a message")
        data = pickle.loads(pickle.dumps(got[0]))
        assert isinstance(data, MessageData)
        assert (data.body, data.attempts, data.nsqd, data.topic, data.channel) == (
            b"\x00binary\xff", 1, nsqd.tcp_address, topic, "ch")
        assert data.id == got[0].id.decode() and data.timestamp == got[0].timestamp
        c.finish_many(got)
    finally:
        c.stop()


def test_sample_rate(nsqd, topic):
    with Producer(nsqd.tcp_address) as p:
        p.multi_publish(topic, [b"%d" % i for i in range(2000)])
    got = []
    c = Consumer(topic, "c", lambda m: got.append(m.body), nsqd_tcp_addresses=[nsqd.tcp_address],
                 config=Config(max_in_flight=200, sample_rate=25))
    c.start()
    # all 2000 in the channel first: depth 0 also holds before the topic's pump has copied them
    wait_for(lambda: drained(nsqd, topic, "c", total=2000), what="channel drained")
    c.stop()
    assert 300 < len(got) < 700, len(got)  # nsqd delivers ~25 % and drops the rest


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
            counts = settled_ready_counts(servers, topic)
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
            counts = settled_ready_counts(servers, topic)
            assert sum(counts) <= 1, counts
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
        assert c._links[nsqd.tcp_address].conn.heartbeats >= 3  # nsqd sent them, we answered NOP
    finally:
        c.stop()


def test_stop_leaves_no_thread(nsqd, topic):
    """Only the process's I/O loops stay (started once, shared by every connection): however
    many consumers come and go, and however many connections each holds, no other thread
    outlives a consumer, and there are no more loops than NSQCLI_IO_THREADS (default 1)."""
    before = set(threading.enumerate())
    for _ in range(3):
        c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[nsqd.tcp_address],
                     lookupd_http_addresses=[], config=Config(max_in_flight=5))
        c.start()
        c.stop()
    time.sleep(0.1)
    new = set(threading.enumerate()) - before
    assert {t.name for t in new} <= {"nsqcli-loop-0"}
    assert len([t for t in threading.enumerate() if t.name.startswith("nsqcli-loop")]) == 1


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
