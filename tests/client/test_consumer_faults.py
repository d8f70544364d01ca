"""Consumer faults against REAL nsqd/nsqlookupd (and a memory stream where nsqd cannot misbehave
on cue): backoff across an nsqd restart, handler parallelism, TOUCH/FIN ordering in pull mode,
rediscovery after an outage, the in-flight byte budget."""

from __future__ import annotations

import threading
import time

from tests.support.helpers import http_post, lookup_producers, wait_for

from nsqcli import Config, Consumer


class Bodies:
    """A handler collecting bodies; raises for the bodies in ``bad``."""

    def __init__(self, bad=()):
        self.bad = set(bad)
        self.got: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, m):
        if m.body in self.bad:
            raise RuntimeError(f"cannot handle {m.body!r}")
        with self.lock:
            self.got.append(m.body)


def flow_state(c):
    with c._lock:
        f = c.flow
        return f.level, f.backoff_until, f.total_rdy


def mpub(server, topic, bodies):
    http_post(server.http_address, "/mpub", b"\n".join(bodies), topic=topic)


# bug 1: stalled at RDY 0 after the test connection dropped ------------------------------------
def test_backoff_survives_an_nsqd_restart_while_testing_the_water(nsqd_factory, topic):
    """In backoff, with the one connection holding RDY 1 to test the water, nsqd restarts: the
    new connection must test the water too, so messages published after recovery arrive (the
    old flow control left every connection at RDY 0 forever)."""
    server = nsqd_factory()
    mpub(server, topic, [b"bad"])
    handler = Bodies(bad=[b"bad"])
    cfg = Config(max_in_flight=10, backoff_multiplier=0.2, default_requeue_delay=60,
                 reconnect_min_delay=0.2, reconnect_max_delay=1.0)
    c = Consumer(topic, "c", handler, nsqd_tcp_addresses=[server.tcp_address], config=cfg,
                 on_error=lambda e: None)
    c.start()
    try:
        # "bad" failed (REQ for 60 s): level 1, then the timer expires and the only connection
        # holds RDY 1 with nothing to deliver
        wait_for(lambda: flow_state(c)[0] >= 1 and flow_state(c)[1:] == (None, 1), what="testing the water")
        server.restart()
        wait_for(lambda: c.connections == [server.tcp_address], timeout=15, what="reconnected")
        good = [b"good-%d" % i for i in range(50)]
        mpub(server, topic, good)
        wait_for(lambda: len(handler.got) == 50, timeout=10, what="messages after recovery")
        assert sorted(handler.got) == sorted(good)
    finally:
        c.stop()


# bug 3: concurrency=N runs N handlers at once, even for messages of one recv batch -------------
class Concurrent:
    """A slow handler counting how many of its calls run at the same time."""

    def __init__(self, want: int):
        self.want = want
        self.running = self.peak = self.done = 0
        self.lock = threading.Lock()
        self.all_done = threading.Event()

    def __call__(self, m):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
            self.done += 1
            if self.done >= self.want:
                self.all_done.set()


def test_concurrency_runs_handlers_in_parallel_within_one_batch(nsqd, topic):
    mpub(nsqd, topic, [b"m%d" % i for i in range(100)])
    handler = Concurrent(100)
    c = Consumer(topic, "c", handler, nsqd_tcp_addresses=[nsqd.tcp_address],
                 config=Config(max_in_flight=100, concurrency=10))
    c.start()
    try:
        assert handler.all_done.wait(30), handler.done
    finally:
        c.stop()
    assert handler.peak >= 5, f"at most {handler.peak} handlers ran at once with concurrency 10"


# bug 4: pull mode, a TOUCH must never follow the FIN of the same message ------------------------
def test_touch_never_follows_the_fin_of_its_message(monkeypatch):
    """Through a memory stream: a TOUCH of held messages is being built when another thread FINs
    them. The bytes nsqd receives never hold a TOUCH after the FIN of the same id (nsqd would
    answer E_TOUCH_FAILED). The FIN is started from inside the TOUCH's encoding - the moment
    between the un-answered check and the write - and given a second to go out first."""
    from tests.support.fakes import FRAME_RESPONSE, MemoryStream, frame, message

    from nsqcli.client import responses as responses_module  # where TOUCHes are encoded

    ids = [b"a" * 16, b"b" * 16]
    stream = MemoryStream()
    c = Consumer("t", "c", pull=True, nsqd_tcp_addresses=["memory:1"], dial=MemoryStream.dialer([stream]),
                 config=Config(max_in_flight=5, heartbeat_interval=0, read_timeout=30))
    stream.feed(frame(FRAME_RESPONSE, b"OK"))  # IDENTIFY
    stream.feed(frame(FRAME_RESPONSE, b"OK") + message(b"1", ids[0]) + message(b"2", ids[1]))
    c.start()
    try:
        got = wait_for(lambda: c.held == 2 and c.poll(10, timeout=0.5), what="two held messages")
        real_encode, racing = responses_module.encode_touch, []

        def encode_touch_racing_a_fin(msg_id):
            if not racing:
                racing.append(threading.Thread(target=c.finish_many, args=(got,)))
                racing[0].start()
                racing[0].join(1.0)
            return real_encode(msg_id)

        monkeypatch.setattr(responses_module, "encode_touch", encode_touch_racing_a_fin)
        c.touch_many(got)
        racing[0].join(5)
        for i in ids:
            stream.wait_sent(b"FIN " + i + b"\n")
        c.set_max_in_flight(4)  # a last command: once it is out, so is everything before it
        stream.wait_sent(b"RDY 4\n")
        sent = bytes(stream.sent)
        for i in ids:
            touch = sent.find(b"TOUCH " + i + b"\n")
            assert touch == -1 or touch < sent.find(b"FIN " + i + b"\n"), sent
    finally:
        stream.feed(None)
        c.stop(timeout=2)


# bug 5: a lookupd-found nsqd that is back is read within seconds --------------------------------
def test_lookupd_found_nsqd_back_after_an_outage_is_read_within_seconds(nsqd, lookupd, extra_nsqd, topic):
    """One of two nsqd is down long enough for the consumer to back off its re-polls of lookupd
    (four quick polls without it: the old schedule then waited 8-16 s, then 16-32 s); once it
    is back, its messages arrive within a few seconds."""

    server = extra_nsqd()
    for s in (nsqd, server):
        http_post(s.http_address, "/topic/create", topic=topic)
    wait_for(lambda: len(lookup_producers(lookupd, topic)) == 2,
             what="both registered")
    got = Bodies()
    # max_in_flight 2: RDY 1 for each nsqd. With 1 (fewer than the connections) the nsqd that
    # comes back waits for its turn at RDY - the flow redistributes every 5 s, as go-nsq does -
    # which is not what this test is about: measured, the message came 4 s after the connection
    # (6.5-8.1 s after the restart: over the 8 s below once in CI); with 2 it came with it.
    c = Consumer(topic, "c", got, lookupd_http_addresses=[lookupd.http_address], on_error=lambda e: None,
                 config=Config(max_in_flight=2))
    c.start()
    try:
        assert sorted(c.connections) == sorted([nsqd.tcp_address, server.tcp_address])
        server.stop()
        wait_for(lambda: c.discovery.fast_polls >= 4, timeout=20, what="four quick re-polls without it")
        server.restart()
        http_post(server.http_address, "/pub", b"back", topic=topic)
        wait_for(lambda: got.got == [b"back"], timeout=8, what="its message, read after the outage")
    finally:
        c.stop()


def test_direct_nsqd_retries_stay_a_few_seconds_apart():
    """However long a direct nsqd stays away, the next attempt is at most reconnect_max_delay
    (4 s by default) away - and the exponent never overflows."""
    c = Consumer("t", "c", lambda m: None, nsqd_tcp_addresses=["127.0.0.1:1"])
    for _ in range(2000):
        c.discovery.schedule_reconnect("127.0.0.1:1")
    failures, when = c.discovery.reconnect["127.0.0.1:1"]
    assert failures == 2000 and when - time.monotonic() <= 4.0


# bug 6: in-flight memory bounded in bytes too -----------------------------------------------------
def test_big_messages_shrink_the_rdy_sent_to_nsqd(nsqd_factory, topic):
    """~2 MB messages with an 8 MiB in-flight byte budget: the consumer asks nsqd for 4 at a
    time, not max_in_flight 50 (as nsqd's /stats and the consumer's stats show)."""
    from tests.support.helpers import channel_stats

    server = nsqd_factory(max_msg_size=3 * 1024 * 1024)
    bodies = [bytes([65 + i]) * 2_000_000 for i in range(6)]
    for body in bodies:
        http_post(server.http_address, "/pub", body, topic=topic)
    got = Bodies()
    c = Consumer(topic, "c", got, nsqd_tcp_addresses=[server.tcp_address],
                 config=Config(max_in_flight=50, max_in_flight_bytes=8 * 1024 * 1024))
    c.start()
    try:
        wait_for(lambda: len(got.got) == 6, timeout=20, what="six big messages")
        assert sorted(got.got) == bodies
        [stats] = c.stats()
        assert stats.rdy == 4
        wait_for(lambda: [cl["ready_count"] for cl in channel_stats(server, topic, "c")["clients"]] == [4],
                 what="nsqd sees RDY 4")
    finally:
        c.stop()


def test_backoff_never_waits_on_an_nsqd_that_has_nothing_to_give(nsqd_factory, topic):
    """Two nsqd, one empty; a handler fails once. When the empty nsqd was picked to test the
    water it delivered nothing, so the level never came down and the other nsqd stayed at RDY 0
    with messages waiting - for ever. The tester now hands over after 1 s."""
    import random

    a, b = nsqd_factory(), nsqd_factory()

    class PickTheEmptyOne(random.Random):  # the unlucky draw, every time it is offered
        def choice(self, seq):
            return next((x for x in seq if getattr(x, "address", None) == b.tcp_address), seq[0])

    for server in (a, b):
        http_post(server.http_address, "/topic/create", topic=topic)
        http_post(server.http_address, "/channel/create", topic=topic, channel="c")
    mpub(a, topic, [b"m%d" % i for i in range(30)])
    handler = Bodies()
    failed = []

    def fail_once(m):
        if not failed:
            failed.append(m.body)
            raise RuntimeError("boom once")
        handler(m)

    c = Consumer(topic, "c", fail_once, config=Config(max_in_flight=10, max_backoff_duration=8),
                 nsqd_tcp_addresses=[a.tcp_address, b.tcp_address], rng=PickTheEmptyOne(0),
                 on_error=lambda e: None)
    c.start()
    try:
        wait_for(lambda: len(handler.got) >= 29, 20, what="every other message (the failed one is requeued "
                                                           "with a delay)")
    finally:
        c.stop(5)
    assert sorted(handler.got + failed) == sorted(b"m%d" % i for i in range(30))


def test_commands_sent_in_part_keep_their_order():
    """Through a memory stream whose socket takes 7 bytes per non-blocking send: FINs and
    REQs from four threads go out partly from their own threads, the rest through the I/O
    thread - every command arrives whole, each thread's in its order, nothing twice."""
    from tests.support.fakes import FRAME_RESPONSE, MemoryStream, frame, message

    ids = [b"%016d" % i for i in range(200)]
    stream = MemoryStream()
    stream.room = 7
    c = Consumer("t", "c", pull=True, nsqd_tcp_addresses=["memory:1"], dial=MemoryStream.dialer([stream]),
                 config=Config(max_in_flight=500, heartbeat_interval=0, read_timeout=30))
    stream.feed(frame(FRAME_RESPONSE, b"OK"))  # IDENTIFY
    stream.feed(frame(FRAME_RESPONSE, b"OK") + b"".join(message(b"m", i) for i in ids))
    c.start()
    try:
        got = wait_for(lambda: c.held == len(ids) and c.poll(len(ids), timeout=0.5), what="held messages")
        assert len(got) == len(ids)
        parts = [got[i::4] for i in range(4)]
        answer = [lambda ms: [c.finish_many([m]) for m in ms], lambda ms: [c.requeue_many([m]) for m in ms]]
        threads = [threading.Thread(target=answer[i % 2], args=(p,)) for i, p in enumerate(parts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        c.set_max_in_flight(4)  # a last command: once it is out, so is everything before it
        stream.wait_sent(b"RDY 4\n")
        lines = bytes(stream.sent).split(b"\n")
        answered = [ln for ln in lines if ln.startswith((b"FIN ", b"REQ "))]
        assert sorted(ln.split()[1] for ln in answered) == sorted(ids)  # each once, each whole
        for i, p in enumerate(parts):
            verb = b"FIN " if i % 2 == 0 else b"REQ "
            mine = [ln.split()[1] for ln in answered if ln.startswith(verb) and ln.split()[1] in {m.id for m in p}]
            assert mine == [m.id for m in p]
        assert c.lost_responses == 0
    finally:
        stream.feed(None)
        c.stop(timeout=2)


def test_an_nsqd_that_stops_reading_does_not_stall_the_others(nsqd, topic):
    """A scripted nsqd sends message after message but never reads: the FINs for it fill both
    socket buffers. The handler writing them must not block (it holds the consumer's lock), or
    every other connection - here a real nsqd - stalls until the write timeout."""
    import socket as socket_module

    from tests.support.fakes import FakeNsqd, message

    from nsqcli import Producer

    stop = threading.Event()

    def never_reads(peer):
        peer.sock.setsockopt(socket_module.SOL_SOCKET, socket_module.SO_RCVBUF, 4096)
        peer.handshake()          # SUB
        peer.respond(b"OK")
        _line = peer.command()    # RDY
        i = 0
        while not stop.is_set() and i < 400_000:  # ~8 MB of FINs come back, and are not read
            peer.send(b"".join(message(b"x", b"%016d" % (i + k)) for k in range(500)))
            i += 500
        stop.wait(30)

    with FakeNsqd(never_reads) as fake:
        got = Bodies()
        c = Consumer(topic, "c", got, nsqd_tcp_addresses=[fake.address, nsqd.tcp_address],
                     config=Config(max_in_flight=5000, write_timeout=30, max_attempts=0))
        c.start()
        try:
            seen = []

            def stalled():  # no more of its messages for a second: its FINs fill the buffers
                seen.append(len(got.got))
                return len(seen) > 20 and seen[-1] == seen[-21] > 1000

            wait_for(stalled, timeout=60, what="the scripted nsqd's connection stalled")
            with Producer(nsqd.tcp_address) as p:
                p.multi_publish(topic, [b"real %d" % i for i in range(100)])
            t0 = time.monotonic()
            wait_for(lambda: sum(1 for b in got.got if b.startswith(b"real")) == 100, timeout=20,
                     what="the real nsqd's messages handled while the other one stalls")
            assert time.monotonic() - t0 < 10  # not after the 30 s write timeout
        finally:
            stop.set()
            c.stop(timeout=5)


def test_nothing_is_written_after_a_send_failed_half_way():
    """A send that fails half-way leaves half a command on the wire: whatever followed it would
    be read as garbage (nsqd answered "invalid command TOUCHFIN") while the writer counted it
    sent. After it, every FIN is refused and counted as lost, and no byte more goes out."""
    from tests.support.fakes import FRAME_RESPONSE, MemoryStream, frame, message

    from nsqcli.errors import WriteError

    ids = [b"%016d" % i for i in range(4)]
    stream = MemoryStream()
    torn, failed = [], []

    def send_half(data):  # the socket takes half the FIN, then the link fails
        if torn:
            failed.append(bytes(data))
            raise WriteError("write failed: Broken pipe", stream.address)
        if bytes(data[:4]) == b"FIN ":
            torn.append(bytes(data))
            stream.sent += data[: len(data) // 2]
            return len(data) // 2
        stream.sent += data
        return len(data)

    stream.send_nowait = send_half
    c = Consumer("t", "c", pull=True, nsqd_tcp_addresses=["memory:1"], dial=MemoryStream.dialer([stream]),
                 config=Config(max_in_flight=5, heartbeat_interval=0, read_timeout=30), on_error=lambda e: None)
    stream.feed(frame(FRAME_RESPONSE, b"OK"))  # IDENTIFY
    stream.feed(frame(FRAME_RESPONSE, b"OK") + b"".join(message(b"m", i) for i in ids))
    c.start()
    try:
        got = wait_for(lambda: c.held == 4 and c.poll(4, timeout=0.5), what="held messages")
        assert c.finish_many(got[:1]) == []  # half of it leaves, the rest waits for the loop: it fails
        wait_for(lambda: failed, what="the send of the rest, which fails")
        after = len(stream.sent)
        lost = c.finish_many(got[1:])
        assert [m.id for m in lost] == ids[1:]
        assert c.lost_responses == 3
        time.sleep(0.2)
        assert len(stream.sent) == after  # not a byte after the torn command
    finally:
        stream.feed(None)
        c.stop(timeout=2)
