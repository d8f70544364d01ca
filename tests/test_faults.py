"""The fault table: misbehaving nsqd / nsqlookupd servers (tests/support/fakes.py) against the real
`nsqcli tail` and `nsqcli pub` executables. For every fault: one clear error line on stderr,
exit 1 (or 3 when the --timeout passed), no traceback, no hang past the deadline, bounded
memory. A real nsqd plays everything it can do on cue elsewhere; these are the faults it cannot."""

from __future__ import annotations

import functools
import struct
import json
import signal
import subprocess
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.helpers import NSQCLI, clean_env
from tests.support.fakes import (FRAME_ERROR, FRAME_RESPONSE, FakeLookupd, FakeNsqd, frame, http_answer,
                   http_request, lookupd_trickle, message)

TIMEOUT = 2.0         # the --timeout given to every command whose row expects the deadline (3)
# a row expecting exit 1 ends when the fault is detected, not at the deadline: it gets 5 s, so that
# a busy machine's start-up is not what passes (a clean-clone CI run: tail met the truncated frame
# as 2 s passed and said exit 3); a longer deadline costs such a row nothing when it passes
DETECTED_TIMEOUT = 5.0
# Rows whose expected exit is 1 (the fault is detected) although the client must do real work
# first: inflating a bomb up to the frame limit costs seconds of CPU on a loaded machine, and the
# 2 s deadline passing first (exit 3) would say nothing about the bomb. A deadline a slow machine
# meets; a hang is still caught (the run is bounded by it + 6 s).
ROW_TIMEOUTS = {"deflate-bomb-of-zeros": 15.0, "deflate-bomb-giant-frame": 15.0}
MAX_RSS_MB = 250      # bounded memory: a decompression bomb must not get near its 1000x


def good_features(**extra) -> dict:
    return {"max_rdy_count": 2500, "version": "fake", "msg_timeout": 60000, **extra}


def after_handshake(action):
    """A script that behaves until SUB/PUB, then does ``action(peer, line)``."""
    def script(peer):
        line = peer.handshake()
        action(peer, line)
        peer.silence()
    return script


def raw_after_identify(data: bytes):
    def script(peer):
        peer.magic()
        peer.until(b"IDENTIFY")
        peer.send(data)
        peer.silence()
    return script


def at_identify(reply: bytes):
    """Answer IDENTIFY with this response frame, then stay silent."""
    return raw_after_identify(frame(FRAME_RESPONSE, reply))


def trickle(data: bytes, every: float = 0.4):
    def script(peer):
        peer.magic()
        peer.until(b"IDENTIFY")
        for b in data:
            peer.sock.sendall(bytes([b]))
            if peer.server.stopped.wait(every):
                return
        peer.silence()
    return script


def deflate_then(payload_fn):
    """Negotiate deflate (the client is run with --deflate), then send ``payload_fn()`` raw.
    ``script.prepare()`` makes the payload before the client starts (a bomb takes a second or
    more to compress on a loaded machine: not the client's time)."""
    def script(peer):
        peer.magic()
        peer.until(b"IDENTIFY")
        peer.respond(json.dumps(good_features(deflate=True, deflate_level=6)).encode())
        peer.sock.sendall(payload_fn())
        peer.silence()
    script.prepare = payload_fn
    return script


@functools.lru_cache(maxsize=4)
def deflate_bomb(first: bytes, total: int = 200 * 1024 * 1024) -> bytes:
    """A raw deflate stream: compressed OK, then ``first`` and zeros up to ``total`` bytes
    (over 1000x smaller on the wire than decompressed)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    out = [c.compress(frame(FRAME_RESPONSE, b"OK")), c.compress(first)]
    zeros = bytes(1 << 20)
    for _ in range(total >> 20):
        out.append(c.compress(zeros))
    out.append(c.flush(zlib.Z_SYNC_FLUSH))
    return b"".join(out)


def snappy_garbage() -> bytes:
    return b"\xff\x06\x00\x00sNaPpY" + b"\x00\x10\x00\x00garbage-garbage!"


def close_now(peer):
    peer.sock.close()


def silent(peer):
    peer.silence()


def garbage_at_once(peer):
    peer.sock.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    peer.silence()


def heartbeats_then_silence(peer):
    peer.magic()
    peer.until(b"IDENTIFY")
    peer.respond(b"_heartbeat_")
    peer.silence()


def auth_then(reply_frame: bytes):
    def script(peer):
        peer.magic()
        peer.until(b"IDENTIFY")
        peer.respond(json.dumps(good_features(auth_required=True)).encode())
        peer.until(b"AUTH")
        peer.send(reply_frame)
        peer.silence()
    return script


# name -> (nsqd script, extra flags, expected exit codes)
NSQD_FAULTS = {
    "closes-at-once": (close_now, [], {1}),
    "http-server-on-tcp-port": (garbage_at_once, [], {1}),
    "silent-after-connect": (silent, [], {3}),
    "identify-not-json": (at_identify(b"{not json"), [], {1}),
    "identify-json-list": (at_identify(b"[1, 2]"), [], {1}),
    "identify-json-string": (at_identify(b'"hello"'), [], {1}),
    "identify-msg-timeout-string": (at_identify(json.dumps(good_features(msg_timeout="x")).encode()), [], {1}),
    "identify-max-rdy-string": (at_identify(json.dumps(good_features(max_rdy_count="abc")).encode()), [], {1}),
    "identify-max-rdy-zero": (at_identify(json.dumps(good_features(max_rdy_count=0)).encode()), [], {1}),
    "identify-max-rdy-negative": (at_identify(json.dumps(good_features(max_rdy_count=-5)).encode()), [], {1}),
    "identify-tls-bool-as-string": (at_identify(json.dumps(good_features(tls_v1="yes")).encode()), [], {1}),
    "identify-unasked-snappy": (at_identify(json.dumps(good_features(snappy=True)).encode()), [], {1}),
    "identify-unasked-deflate": (at_identify(json.dumps(good_features(deflate=True)).encode()), [], {1}),
    "identify-unasked-tls": (at_identify(json.dumps(good_features(tls_v1=True)).encode()), [], {1}),
    "identify-auth-required-no-secret": (at_identify(json.dumps(good_features(auth_required=True)).encode()), [], {1}),
    "identify-error-frame": (raw_after_identify(frame(FRAME_ERROR, b"E_INVALID bad IDENTIFY")), [], {1}),
    "identify-empty-error-frame": (raw_after_identify(frame(FRAME_ERROR, b"")), [], {1}),
    "identify-message-frame": (raw_after_identify(message(b"too early")), [], {1}),
    "negative-frame-size": (raw_after_identify(b"\xff\xff\xff\xff\x00\x00\x00\x00"), [], {1}),
    "huge-frame-size": (raw_after_identify(b"\x7f\xff\xff\xff\x00\x00\x00\x00"), [], {1}),
    "unknown-frame-type": (raw_after_identify(b"\x00\x00\x00\x06\x00\x00\x00\x07OK"), [], {1}),
    "short-message-frame": (raw_after_identify(b"\x00\x00\x00\x0a\x00\x00\x00\x02abcdef"), [], {1}),
    "truncated-frame-then-close": (lambda p: (p.magic(), p.until(b"IDENTIFY"),
                                              p.sock.sendall(b"\x00\x00\x00\x64\x00\x00\x00\x00OK")), [], {1}),
    "identify-trickled": (trickle(frame(FRAME_RESPONSE, b"OK") * 3), [], {3}),
    "heartbeat-then-silence": (heartbeats_then_silence, [], {3}),
    "silent-after-sub-or-pub": (after_handshake(lambda p, line: None), [], {3}),
    "close-wait-instead-of-ok": (after_handshake(lambda p, line: p.respond(b"CLOSE_WAIT")), [], {1, 3}),
    "unknown-reply-instead-of-ok": (after_handshake(lambda p, line: p.respond(b"WHAT?")), [], {1, 3}),
    "closes-after-sub-or-pub": (after_handshake(lambda p, line: p.sock.close()), [], {1, 3}),
    "error-after-sub-or-pub": (after_handshake(lambda p, line: p.error(b"E_BAD_TOPIC nope")), [], {1, 3}),
    "garbage-after-sub-or-pub": (after_handshake(lambda p, line: p.sock.sendall(b"\x00\x00\x00\x00garbage")), [], {1}),
    "auth-reply-not-json": (auth_then(frame(FRAME_RESPONSE, b"not json")), ["--auth-secret", "s"], {1}),
    "auth-failed": (auth_then(frame(FRAME_ERROR, b"E_AUTH_FAILED AUTH failed")), ["--auth-secret", "s"], {1}),
    "deflate-corrupt-stream": (deflate_then(lambda: b"\xff" * 64), ["--deflate"], {1}),
    "deflate-bomb-of-zeros": (deflate_then(lambda: deflate_bomb(b"")), ["--deflate"], {1}),
    "deflate-bomb-giant-frame": (deflate_then(lambda: deflate_bomb(b"\x05\x00\x00\x00\x00\x00\x00\x02")),
                                 ["--deflate"], {1}),
    "snappy-corrupt-stream": (lambda p: (p.magic(), p.until(b"IDENTIFY"),
                                         p.respond(json.dumps(good_features(snappy=True)).encode()),
                                         p.sock.sendall(snappy_garbage()), p.silence()), ["--snappy"], {1}),
}


def run_limited(args: list[str], timeout: float = 20.0) -> tuple[int, bytes, bytes, float, float]:
    """Run nsqcli; returns (exit code, stdout, stderr, seconds, its own peak RSS in MB)."""
    env = clean_env()
    t0 = time.monotonic()
    p = subprocess.Popen(NSQCLI + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    chunks = {"out": b"", "err": b""}

    def drain(name, f):
        chunks[name] = f.read()

    readers = [threading.Thread(target=drain, args=("out", p.stdout)),
               threading.Thread(target=drain, args=("err", p.stderr))]
    for t in readers:
        t.start()
    peak = [0.0]

    def watch_rss():
        # VmHWM: the high-water mark of the process's own memory since exec (ru_maxrss would
        # also count the pytest process it was forked from)
        while p.poll() is None:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            peak[0] = max(peak[0], int(line.split()[1]) / 1024)
            except (OSError, ValueError):
                pass
            time.sleep(0.01)

    readers.append(threading.Thread(target=watch_rss))
    readers[-1].start()
    try:
        p.wait(timeout)
        hung = False
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        hung = True
    for t in readers:
        t.join()
    if hung:
        raise AssertionError(f"nsqcli {' '.join(args)} hung past {timeout}s; stderr: {chunks['err'][-500:]!r}")
    return p.returncode, chunks["out"], chunks["err"], time.monotonic() - t0, peak[0]


def check(args: list[str], expected: set[int], max_seconds: float = TIMEOUT + 6) -> None:
    rc, out, err, secs, rss = run_limited(args)
    text = err.decode(errors="replace")
    lines = [line for line in text.splitlines() if line]
    assert "Traceback" not in text and "Exception ignored" not in text, text
    assert rc in expected, f"exit {rc}, expected {expected}: {text}"
    assert lines and lines[-1].startswith("nsqcli: error: "), text
    assert all(line.startswith("nsqcli: ") for line in lines), text
    assert len(lines[-1]) < 400, lines[-1]
    assert secs < max_seconds, f"took {secs:.1f}s"
    assert rss < MAX_RSS_MB, f"peak RSS {rss:.0f} MB"
    assert out == b""


@pytest.mark.parametrize("name", sorted(NSQD_FAULTS))
def test_fault_table_tail_and_pub(name):
    script, flags, expected = NSQD_FAULTS[name]
    if hasattr(script, "prepare"):
        script.prepare()
    timeout = ROW_TIMEOUTS.get(name, TIMEOUT if 3 in expected else DETECTED_TIMEOUT)
    with FakeNsqd(script) as fake_tail, FakeNsqd(script) as fake_pub:
        tail = ["tail", "-t", "t", "-n", "1", "--timeout", f"{timeout}s",
                "--nsqd-tcp-address", fake_tail.address, *flags]
        pub = ["pub", "-t", "t", "--timeout", f"{timeout}s", "--nsqd-tcp-address", fake_pub.address,
               *flags, "hello"]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda a: (a[0], _check_capture(a[1], expected, timeout + 6)),
                                    [("tail", tail), ("pub", pub)]))
    failures = [f"{cmd}: {err}" for cmd, err in results if err]
    assert not failures, "\n".join(failures)


def _check_capture(args, expected, max_seconds=TIMEOUT + 6):
    try:
        check(args, expected, max_seconds)
    except AssertionError as e:
        return str(e)
    return None


def test_fault_table_has_at_least_30_misbehaviours():
    assert len(NSQD_FAULTS) + len(LOOKUPD_FAULTS) >= 30


# -- nsqlookupd ----------------------------------------------------------------------------------
def lookupd_answers(status: int, body: bytes):
    def script(peer):
        http_request(peer)
        http_answer(peer, status, body)
    return script


def lookupd_silent(peer):
    http_request(peer)
    peer.silence()


LOOKUPD_FAULTS = {
    "lookupd-trickles": (lookupd_trickle, {1, 3}),
    "lookupd-silent": (lookupd_silent, {1, 3}),
    "lookupd-500": (lookupd_answers(500, b'{"message":"INTERNAL_ERROR"}'), {1}),
    "lookupd-not-http": (lambda p: (http_request(p), p.sock.sendall(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")), {1}),
    "lookupd-json-list": (lookupd_answers(200, b"[1, 2, 3]"), {1}),
    "lookupd-producers-wrong-types": (lookupd_answers(200, b'{"producers": [{"broadcast_address": 5}]}'), {1}),
    "lookupd-producers-not-a-list": (lookupd_answers(200, b'{"producers": "x"}'), {1}),
    "lookupd-dead-producer": (lookupd_answers(200, json.dumps({"producers": [
        {"broadcast_address": "127.0.0.1", "tcp_port": 1, "http_port": 2}]}).encode()), {1, 3}),
}


@pytest.mark.parametrize("name", sorted(LOOKUPD_FAULTS))
def test_lookupd_fault_table_tail_pub_lookup_stat(name):
    script, expected = LOOKUPD_FAULTS[name]
    with FakeLookupd(script) as a, FakeLookupd(script) as b, FakeLookupd(script) as c, FakeLookupd(script) as d:
        # not TIMEOUT: on a busy machine (two test passes at once) tail's start-up took most of 2 s,
        # then of 3 s, and a malformed answer was met as the --timeout passed - exit 3 instead of 1.
        # A row that expects the fault detected (1) gets DETECTED_TIMEOUT, as the nsqd rows do: the
        # fault ends the run long before it
        deadline = f"{DETECTED_TIMEOUT:g}s" if expected == {1} else "3s"
        runs = [("tail", ["tail", "-t", "t", "-n", "1", "--timeout", deadline, "--lookupd-http-address", a.address],
                 expected),
                ("pub", ["pub", "-t", "t", "--timeout", deadline, "--lookupd-http-address", b.address, "hello"],
                 expected)]
        if name != "lookupd-dead-producer":  # for lookup and stat that lookupd answered correctly
            # stat has no --timeout: a baseline and a report, each bounded by the 5 s HTTP deadline
            runs += [("lookup", ["lookup", "--lookupd-http-address", c.address], {1}, 8),
                     ("stat", ["stat", "--lookupd-http-address", d.address, "--count", "1", "--interval", "0.2s"],
                      {1}, 14)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda r: (r[0], _check_capture(*r[1:])), runs))
    failures = [f"{cmd}: {err}" for cmd, err in results if err]
    assert not failures, "\n".join(failures)


def test_sigterm_stops_tail_during_a_trickling_lookupd():
    """The first SIGTERM stops within a bounded time even while lookupd trickles its answer."""
    with FakeLookupd(lookupd_trickle) as fake:
        env = clean_env()
        p = subprocess.Popen(NSQCLI + ["tail", "-t", "t", "--lookupd-http-address", fake.address],
                             stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        time.sleep(1.0)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=8)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError("tail ignored SIGTERM while lookupd trickled")
        assert time.monotonic() - t0 < 6.5
        assert b"Traceback" not in err


# -- the publish path: `nsqcli mpub` against servers that answer its batches badly --------------
class Held:
    """What a fake nsqd published, over all of its connections (the ground truth of a row)."""

    def __init__(self):
        self.count = 0
        self.lock = threading.Lock()


def publishing(policy):
    """A script that handshakes, then answers each MPUB as ``policy(held, n, peer)`` says, n
    counting the MPUBs of this connection from 1: "ok", "close" (without publishing or
    answering), b"E_..." (an error frame, then close), or a callable doing it itself."""
    held = Held()

    def script(peer):
        peer.identify()
        n = 0
        while True:
            line, payload = peer.command()
            if not line.startswith(b"MPUB"):
                continue
            n += 1
            action = policy(held, n, peer)
            if action == "close":
                return
            if isinstance(action, bytes):
                peer.error(action)
                return
            if action == "ok":
                with held.lock:
                    held.count += struct.unpack(">l", payload[:4])[0]
                peer.respond(b"OK")
            else:
                action(peer, held, payload)
    script.held = held
    return script


def trickled_ok(peer, held, payload):
    held.count += struct.unpack(">l", payload[:4])[0]
    for b in frame(FRAME_RESPONSE, b"OK"):
        peer.sock.sendall(bytes([b]))
        time.sleep(0.002)


def heartbeats_then_ok(peer, held, payload):
    for _ in range(20):
        peer.respond(b"_heartbeat_")
    held.count += struct.unpack(">l", payload[:4])[0]
    peer.respond(b"OK")


def garbage(peer, held, payload):
    peer.sock.sendall(b"\x00\x00\x00\x00garbage")
    peer.silence()


# name -> (policy, expected exit code); always: the JSON summary's "published" and "resume_skip"
# are exactly what the server held, and the stderr is one error line
PUBLISH_FAULTS = {
    "all-ok": (lambda h, n, p: "ok", 0),
    "trickled-oks": (lambda h, n, p: trickled_ok, 0),
    "heartbeat-storm-before-each-ok": (lambda h, n, p: heartbeats_then_ok, 0),
    "e-mpub-failed-always": (lambda h, n, p: b"E_MPUB_FAILED MPUB failed", 1),
    "e-mpub-failed-on-the-third-batch": (lambda h, n, p: "ok" if n < 3 else b"E_MPUB_FAILED MPUB failed", 1),
    "e-bad-topic": (lambda h, n, p: b"E_BAD_TOPIC MPUB topic name is not valid", 1),
    "closes-mid-window": (lambda h, n, p: "ok" if n < 3 else "close", 1),
    "garbage-after-two-oks": (lambda h, n, p: "ok" if n < 3 else garbage, 1),
    "e-bad-body-on-every-batch-over-1000-bytes": (None, 0),
    "ok-nobody-asked-for": (None, 1),
}


def _bad_body_over(limit):
    """Like nsqd with --max-body-size=limit: it reads a batch's size first and refuses (then
    closes) without reading the body."""
    held = Held()

    def script(peer):
        peer.identify()
        while True:
            while b"\n" not in peer.buf:
                if not peer._fill():
                    return
            line, peer.buf = peer.buf.split(b"\n", 1)
            if not line.startswith(b"MPUB"):
                continue
            size = struct.unpack(">l", peer.read(4))[0]
            if size > limit:
                peer.error(b"E_BAD_BODY MPUB body too big %d > %d" % (size, limit))
                return
            held.count += struct.unpack(">l", peer.read(size)[:4])[0]
            peer.respond(b"OK")
    script.held = held
    return script


def _unasked_ok():
    def script(peer):  # an OK glued to the IDENTIFY reply: it came before any publish was written
        peer.magic()
        peer.until(b"IDENTIFY")
        peer.send(frame(FRAME_RESPONSE, b"OK") + frame(FRAME_RESPONSE, b"OK"))
        peer.silence()
    script.held = Held()
    return script


@pytest.mark.parametrize("name", sorted(PUBLISH_FAULTS))
def test_publish_fault_table_mpub_counts_exactly(name):
    policy, expected = PUBLISH_FAULTS[name]
    if name.startswith("e-bad-body"):
        script = _bad_body_over(1000)
    elif name == "ok-nobody-asked-for":
        script = _unasked_ok()
    else:
        script = publishing(policy)
    records = b"".join(b"record-%05d\n" % i for i in range(2000))
    with FakeNsqd(script) as fake:
        p = subprocess.run(NSQCLI + ["mpub", "-t", "t", "--json", "--batch-size", "500", "--nsqd-tcp-address",
                                     fake.address], input=records, capture_output=True, timeout=30, env=clean_env())
    err = p.stderr.decode(errors="replace")
    assert p.returncode == expected, err
    assert "Traceback" not in err
    doc = json.loads(p.stdout)
    assert doc["published"] == script.held.count == doc["resume_skip"], (doc, script.held.count, err)
    if expected == 0:
        assert doc["published"] == 2000
    else:
        assert err.splitlines()[-1].startswith("nsqcli: error: ") and f"--skip {script.held.count}" in err


def test_a_server_failing_every_reconnect_the_same_way_is_said_once_with_a_count():
    """Garbage right after SUB's OK on every connection: one warning when it starts and one with
    the count at the end - not one per reconnect (it was 8-10 identical lines)."""
    def script(peer):
        peer.handshake()
        peer.respond(b"OK")
        peer.sock.sendall(b"\x00\x00\x00\x00garbage")
        peer.silence(5)

    with FakeNsqd(script) as fake:
        p = subprocess.run(NSQCLI + ["tail", "-t", "t", "--timeout", "6s", "--nsqd-tcp-address", fake.address],
                           capture_output=True, timeout=30, env=clean_env())
        connections = fake.connections
    said = [line for line in p.stderr.decode().splitlines() if "invalid frame size 0" in line]
    assert connections >= 3  # it did reconnect, and failed each time
    assert len(said) == 2, said
    assert "(x" in said[1] and "not recovered" in said[1], said


def test_a_tls_peer_stalling_mid_record_fails_the_connection_instead_of_hanging_it(tmp_path, nsqd, topic):
    """select() says readable when part of a TLS record arrived; a blocking SSL read then waited
    for the rest for ever (the I/O thread, and so close(), hung). Now reads never block: the
    I/O loop goes on serving every other connection (a publish to a real nsqd is answered
    meanwhile), and the stalled one fails when no byte came for 2 heartbeats + 5 s, its
    publish answered with an error."""
    import ssl

    from tests.support.nsq_fixtures import make_cert
    from nsqcli import Config, Producer
    from nsqcli.client.config import TLSConfig
    from nsqcli.errors import TransportError

    cert, key = make_cert(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def script(peer):
        peer.magic()
        peer.until(b"IDENTIFY")
        peer.respond(json.dumps(good_features(tls_v1=True)).encode())
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(incoming, outgoing, server_side=True)

        while True:  # the TLS handshake, by hand
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                peer.sock.sendall(outgoing.read())
                data = peer.sock.recv(65536)
                if not data:
                    return
                incoming.write(data)
        peer.sock.sendall(outgoing.read())
        tls.write(frame(FRAME_RESPONSE, b"OK"))  # the OK to the TLS upgrade
        peer.sock.sendall(outgoing.read())
        got = b""
        while b"PUB" not in got:  # the client's publish
            data = peer.sock.recv(65536)
            if not data:
                return
            incoming.write(data)
            try:
                got += tls.read(65536)
            except ssl.SSLWantReadError:
                pass
        tls.write(frame(FRAME_RESPONSE, b"OK"))
        record = outgoing.read()
        peer.sock.sendall(record[: len(record) // 2])  # half a TLS record, then nothing
        peer.silence()

    with FakeNsqd(script) as fake:
        cfg = Config(tls=TLSConfig(enabled=True, insecure_skip_verify=True), write_timeout=1.0,
                     heartbeat_interval=1.0)
        p = Producer(fake.address, cfg)
        conn = p.connection()
        fut = p._send(conn, b"PUB t\n\x00\x00\x00\x01x")
        t0 = time.monotonic()
        time.sleep(1.0)  # the half record is in
        with Producer(nsqd.tcp_address) as healthy:
            healthy.publish(topic, b"served while the other link is stalled", timeout=3)
        assert conn.closed_event.wait(10), "the stalled connection never failed"
        with pytest.raises(TransportError):
            fut.result(1)
        assert time.monotonic() - t0 < 9
        p.close(1)
