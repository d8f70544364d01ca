"""The Producer on real nsqd: PUB/MPUB/DPUB, typed errors, failover, publish_iter."""

from __future__ import annotations

import threading
import time

import pytest
from tests.support.helpers import channel_stats, consume, http_get_json, topic_stats

from nsqcli import Config, Producer
from nsqcli.errors import BadTopicError, PublishError, ServerError, TransportError

BODIES = [b"plain", b"with\nnewline", bytes(range(256)), b"\x00" * 10, "é✓".encode(), b"x" * 100_000]


def test_producer_close_resolves_every_future(nsqd, topic):
    p = Producer(nsqd.tcp_address)
    futures = [f for i in range(2000) for f in p.publish_async(topic, b"m%d" % i)]
    p.close()
    assert all(f.done() for f in futures)
    assert all(f.result(0) == b"OK" for f in futures)
    assert topic_stats(nsqd, topic)["message_count"] == 2000


def test_publish_iter_streams_in_bounded_memory_and_counts_exactly(nsqd_factory, topic):
    server = nsqd_factory()
    produced = [0]

    def bodies():
        for i in range(200_000):
            produced[0] += 1
            yield b"%08d" % i

    with Producer(server.tcp_address) as p:
        res = p.publish_iter(topic, bodies(), batch_size=500, window=4)
    assert res.published == 200_000 and topic_stats(server, topic)["message_count"] == 200_000

    def slow_bodies():
        for i in range(10**9):
            yield b"%08d" % i

    p = Producer(server.tcp_address)
    stopper = threading.Timer(1.0, server.stop)  # clean stop: nsqd keeps what it acknowledged
    stopper.start()
    with pytest.raises(PublishError) as e:
        p.publish_iter(topic + "_b", slow_bodies(), batch_size=100, window=4, rate=20000)
    p.close(timeout=1)
    stopper.join()
    server.start()
    stored = topic_stats(server, topic + "_b")["depth"]
    # acknowledged = stored, except batches nsqd stored but could not answer while shutting down
    assert 0 < e.value.published <= stored <= e.value.published + 4 * 100


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
            conn = p.connection()
            p.await_answer(p._send(conn, b"PUB bad!topic\n\x00\x00\x00\x01x"), 5, conn)
        assert e.value.code == "E_BAD_TOPIC"
        with pytest.raises(PublishError, match="published 0 of 1 messages") as e:
            p.multi_publish(topic, [b"y" * (2 * 1024 * 1024)])  # over nsqd's 1 MiB max-msg-size
        assert isinstance(e.value.cause, ServerError) and e.value.cause.code == "E_BAD_MESSAGE"
    with pytest.raises(PublishError, match="connection refused|cannot connect"):
        Producer("127.0.0.1:1").publish(topic, b"x")


def test_bodies_are_checked_as_sent_before_anything_is_published(nsqd, topic):
    """multi_publish refuses a bad body before sending any: sizes are counted as sent (a str
    as UTF-8, a memoryview by its bytes), and a body that is not bytes or str is refused, not
    turned into zero bytes; publish_iter publishes what came before and names the bad one."""
    from nsqcli.errors import LocalProtocolError

    wide = memoryview(bytes(800)).cast("I")  # len() 200, 800 bytes on the wire
    with Producer(nsqd.tcp_address, Config(max_msg_size=600)) as p:
        for bad, why in (("é" * 400, "message 2 is 800 bytes, over the 600-byte max message size"),
                         (wide, "message 2 is 800 bytes, over the 600-byte max message size"),
                         (5, "message 2 must be bytes or str, got int"),
                         ("", "message 2 is empty")):
            with pytest.raises(LocalProtocolError, match=why):
                p.multi_publish(topic, [b"first", bad, b"third"], batch_size=1)
        assert topic_stats(nsqd, topic) is None  # nothing reached nsqd
        assert p.multi_publish(topic, [b"first", "é" * 10, bytearray(b"third")]).published == 3
        with pytest.raises(PublishError, match="published 1 of 1 messages.*message 2 must be bytes or str") as e:
            p.publish_iter(topic + "_it", iter([b"ok", 7, b"never"]), batch_size=1)
        assert e.value.published == 1
    col = consume(topic, 3, [nsqd.tcp_address])
    assert sorted(col.bodies) == sorted([b"first", ("é" * 10).encode(), b"third"])
    assert topic_stats(nsqd, topic + "_it")["message_count"] == 1


def test_failover_and_fanout(nsqd, extra_nsqd, topic):
    other = extra_nsqd()
    with Producer(["127.0.0.1:1", other.tcp_address]) as p:
        assert p.publish(topic, b"failover") == [other.tcp_address]
    with Producer([nsqd.tcp_address, other.tcp_address], fanout=True) as p:
        assert p.publish(topic, b"both") == [nsqd.tcp_address, other.tcp_address]
    assert http_get_json(nsqd.http_address, "/stats", format="json", topic=topic)["topics"][0]["message_count"] == 1
    assert http_get_json(other.http_address, "/stats", format="json", topic=topic)["topics"][0]["message_count"] == 2


def test_future_first_settle_wins_and_wakes_every_waiter():
    """The publish path's Future: many threads wait, two settle at once (the I/O thread's
    answer and a close's TransportError), exactly one outcome is seen by all, and a wait
    with a timeout on an unsettled future returns in about that time."""
    from nsqcli.client.producer import Future

    lonely = Future()
    t0 = time.monotonic()
    assert lonely.wait(0.05) is False and not lonely.done()
    assert 0.04 <= time.monotonic() - t0 < 2.0
    with pytest.raises(TimeoutError):
        lonely.result(0)

    for _ in range(200):
        fut = Future()
        seen, go = [], threading.Barrier(3)

        def waiter():
            try:
                seen.append(fut.result(5))
            except Exception as e:  # noqa: BLE001 - the other outcome
                seen.append(type(e))

        waiters = [threading.Thread(target=waiter) for _ in range(4)]
        for t in waiters:
            t.start()
        setters = [threading.Thread(target=lambda: (go.wait(), fut.set_result(b"OK"))),
                   threading.Thread(target=lambda: (go.wait(), fut.set_exception(TransportError("lost"))))]
        for t in setters:
            t.start()
        go.wait()
        for t in setters + waiters:
            t.join(5)
        assert fut.done() and len(seen) == 4 and len(set(seen)) == 1, seen
        assert seen[0] in (b"OK", TransportError)
        assert fut.wait(0) is True  # settled stays settled for later waiters


class _Interrupted(Exception):
    pass


def test_a_waiter_interrupted_by_a_signal_does_not_keep_the_others_waiting():
    """Ctrl-C lands in the main thread just as its future is settled (between taking and
    passing on the future's lock): another thread waiting on the same future still gets the
    answer at once, and later waits see it settled."""
    import signal

    from nsqcli.client.producer import Future

    handled = []

    def interrupt(*_):
        handled.append(1)
        raise _Interrupted()

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        for _ in range(20):
            fut, main, got = Future(), threading.get_ident(), []
            other = threading.Thread(target=lambda: got.append(fut.result(10)), daemon=True)
            handled.clear()

            def answer():
                other.start()
                time.sleep(0.05)
                fut.set_result(b"OK")
                signal.pthread_kill(main, signal.SIGUSR1)

            threading.Thread(target=answer, daemon=True).start()
            deadline = time.monotonic() + 10
            try:
                fut.result(10)
                while not handled and time.monotonic() < deadline:  # a late signal lands here
                    time.sleep(0.01)
            except _Interrupted:
                pass
            assert handled
            other.join(10)
            assert got == [b"OK"] and fut.wait(0) and not fut._lock.locked()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_the_pacer_gives_no_credit_for_a_stall():
    """--rate 100 in calls of 5: after the caller stalled 0.3 s the next 30 items still take
    their 0.3 s (they went at once, a burst over the rate: 115 in one second at --rate 100 in a
    busy CI run of test_mpub_rate_holds_within_every_second)."""
    from nsqcli.client.publish_iter import Pacer

    pacer = Pacer(100)
    for _ in range(4):
        pacer.wait(5)
    time.sleep(0.3)  # the stall: a descheduled process, an nsqd slow to answer
    t0 = time.monotonic()
    for _ in range(6):
        pacer.wait(5)
    assert time.monotonic() - t0 >= 0.28  # a slower machine only makes it longer
