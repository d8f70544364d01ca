"""nsqcli to-nsq between real nsqd: exact copies, kill -9 mid-copy with nothing lost, a dead
destination (requeue, nothing lost), JSON filters, fanout and round-robin."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import pytest

from tests.support.helpers import NSQCLI, clean_env, http_post, one_error_line, plain_lines, run_nsqcli, topic_stats, wait_for
from tests.support.inprocess import run_in_process
from tests.support.nsq_fixtures import default_layout_nsqd


def count(node, topic) -> int:
    t = topic_stats(node, topic)
    return t["message_count"] if t else 0


def drain(node, topic, channel) -> list[bytes]:
    """Every body waiting in ``channel`` of ``topic`` (read with nsqcli tail)."""
    r = run_nsqcli(["tail", topic, "-c", channel, "--idle-timeout", "1s", "-0", "--nsqd-tcp-address",
                    node.tcp_address], timeout=120)
    assert r.returncode == 0, r.stderr
    return [b for b in r.stdout.split(b"\0") if b]


def publish(node, topic, bodies):
    for i in range(0, len(bodies), 1000):
        http_post(node.http_address, "/mpub", b"\n".join(bodies[i:i + 1000]), topic=topic)


def test_copies_every_message_and_fins_only_after_the_ok(nsqd_factory, topic):
    src, dst = nsqd_factory(), nsqd_factory()
    bodies = [b"m%05d" % i for i in range(5000)]
    publish(src, topic, bodies)
    http_post(dst.http_address, "/topic/create", topic="copy")
    http_post(dst.http_address, "/channel/create", topic="copy", channel="check")
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "--destination-topic", "copy", "-n", "5000"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert plain_lines(r.stderr.decode())[-1].startswith("nsqcli: copied 5,000, left out by filters 0, failed batches 0")
    assert count(dst, "copy") == 5000
    ch = topic_stats(src, topic)["channels"][0]
    assert (ch["channel_name"], ch["depth"], ch["in_flight_count"], ch["message_count"]) == ("nsq_to_nsq", 0, 0, 5000)
    assert sorted(drain(dst, "copy", "check")) == bodies


def test_kill_9_mid_copy_loses_nothing(nsqd_factory, topic):
    src, dst = nsqd_factory(msg_timeout="5s"), nsqd_factory()
    n = 60000
    bodies = [b"k%06d" % i for i in range(n)]
    publish(src, topic, bodies)
    http_post(dst.http_address, "/topic/create", topic=topic)
    http_post(dst.http_address, "/channel/create", topic=topic, channel="check")
    cmd = NSQCLI + ["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "--max-in-flight", "500", "--rate", "20000"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env())
    try:
        wait_for(lambda: count(dst, topic) >= 10000, timeout=30, what="copying under way")
    finally:
        p.kill()  # kill -9: in-flight messages were neither FINed nor acknowledged everywhere
        p.wait(10)
    copied_before = count(dst, topic)
    assert 10000 <= copied_before < n, "killed too late to prove anything"
    wait_for(lambda: topic_stats(src, topic)["channels"][0]["in_flight_count"] == 0, timeout=90,
             what="nsqd timing out the killed copier's in-flight messages")  # nsqd's --msg-timeout
    r = run_nsqcli(cmd[3:] + ["--idle-timeout", "2s"], timeout=120)
    assert r.returncode == 0, r.stderr
    ch = topic_stats(src, topic)["channels"][0]
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0
    got = drain(dst, topic, "check")
    assert set(got) == set(bodies)                     # every message arrived
    assert len(got) - n == count(dst, topic) - n >= 0  # duplicates only from the kill (at least once)


def test_a_dead_destination_requeues_and_loses_nothing(nsqd_factory, topic):
    src = nsqd_factory(msg_timeout="10s")
    publish(src, topic, [b"a", b"b", b"c"])
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    "127.0.0.1:1", "--idle-timeout", "3s"], timeout=60)
    assert r.returncode == 0
    warnings = [ln for ln in plain_lines(r.stderr.decode()) if ln.startswith("nsqcli: warning:")]
    assert warnings == ["nsqcli: warning: destination: 127.0.0.1:1: cannot connect: Connection refused (the batch "
                        "is requeued; the consumer backs off)"]  # said once, not per batch
    ch = topic_stats(src, topic)["channels"][0]
    assert ch["depth"] + ch["in_flight_count"] + ch["deferred_count"] == 3 and ch["requeue_count"] >= 3


def test_json_filters_fanout_and_round_robin(nsqd_factory, topic):
    src, d1, d2 = nsqd_factory(), nsqd_factory(), nsqd_factory()
    docs = [{"id": i, "region": "eu" if i % 2 else "us", "secret": "x"} for i in range(10)]
    publish(src, topic, [json.dumps(d).encode() for d in docs] + [b"not json"])
    for d in (d1, d2):
        http_post(d.http_address, "/topic/create", topic="eu")
        http_post(d.http_address, "/channel/create", topic="eu", channel="check")
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    d1.tcp_address, "--destination-nsqd-tcp-address", d2.tcp_address, "--destination-topic", "eu",
                    "--mode", "fanout", "--require-json-field", "region", "--require-json-value", "eu",
                    "--whitelist-json-field", "id", "--idle-timeout", "2s"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "copied 5, left out by filters 6" in r.stderr.decode()
    for d in (d1, d2):  # fanout: both have all five, with only the whitelisted field
        assert sorted(drain(d, "eu", "check")) == sorted(b'{"id":%d}' % i for i in range(1, 10, 2))
    assert topic_stats(src, topic)["channels"][0]["depth"] == 0  # what the filters left out is FINed

    publish(src, "rr", [b"r%d" % i for i in range(4000)])
    r = run_nsqcli(["to-nsq", "-t", "rr", "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    d1.tcp_address, "--destination-nsqd-tcp-address", d2.tcp_address, "--mode", "round-robin",
                    "--max-in-flight", "100", "-n", "4000"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert count(d1, "rr") > 0 and count(d2, "rr") > 0 and count(d1, "rr") + count(d2, "rr") == 4000


def test_destination_found_through_lookupd(sandbox, nsqd_factory, topic):
    src = nsqd_factory()
    publish(src, topic, [b"x", b"y"])
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address,
                    "--destination-lookupd-http-address", sandbox.lookupd.http_address, "-n", "2"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert count(sandbox.nsqd, topic) == 2
    r = run_in_process(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address])
    assert r.returncode == 2 and b"give --destination-nsqd-tcp-address or --destination-lookupd-http-address" in r.stderr


def test_sigterm_stops_cleanly(nsqd_factory, topic):
    src, dst = nsqd_factory(), nsqd_factory()
    publish(src, topic, [b"s%d" % i for i in range(20000)])
    p = subprocess.Popen(NSQCLI + ["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address,
                                   "--destination-nsqd-tcp-address", dst.tcp_address, "--rate", "5000"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env())
    wait_for(lambda: count(dst, topic) >= 1000, timeout=30, what="copying")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    # what was in flight when the connection closed goes back to the channel (nsqd does it on the close)
    wait_for(lambda: topic_stats(src, topic)["channels"][0]["in_flight_count"] == 0, what="nothing in flight")
    ch = topic_stats(src, topic)["channels"][0]
    # every message is either FINed (copied) or back in the channel; nothing in flight
    assert ch["in_flight_count"] == 0 and ch["depth"] + count(dst, topic) >= 20000


def test_destination_with_its_own_tls_and_auth(nsqd_factory, topic, tmp_path):
    from tests.support.nsq_fixtures import AuthServer, make_cert

    cert, key = make_cert(tmp_path)
    src = nsqd_factory()
    publish(src, topic, [b"t1", b"t2", b"t3"])
    with AuthServer({"dst-secret": [(".*", [".*"], ["publish", "subscribe"])]}) as auth:
        dst = nsqd_factory(tls_cert=cert, tls_key=key, auth_http_address=auth.address)
        secret = tmp_path / "dst-secret"
        secret.write_text("dst-secret\n")
        base = ["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                dst.tcp_address, "--destination-tls", "--destination-tls-ca-file", cert]
        r = run_nsqcli(base + ["--destination-auth-secret", "wrong", "--idle-timeout", "2s", "--requeue-delay", "1s"],
                       timeout=60)
        assert r.returncode == 0 and b"E_AUTH_FAILED" in r.stderr and b"wrong" not in r.stderr
        assert count(dst, topic) == 0 and topic_stats(src, topic)["channels"][0]["requeue_count"] >= 1
        wait_for(lambda: (c := topic_stats(src, topic)["channels"][0])["deferred_count"] == 0 and c["depth"] == 3,
                 what="the requeued batch back after its delay")
        r = run_nsqcli(base + ["--destination-auth-secret-file", str(secret), "--destination-snappy", "-n", "3"],
                       timeout=120)
        assert r.returncode == 0, r.stderr
        assert count(dst, topic) == 3
        assert any(c.get("secret") == "dst-secret" and c.get("tls") == "true" for c in auth.calls), auth.calls


def test_a_2_mib_message_is_copied_when_both_nsqd_accept_it(nsqd_factory, topic):
    src = nsqd_factory(max_msg_size=4 << 20, max_body_size=8 << 20)
    dst = nsqd_factory(max_msg_size=4 << 20, max_body_size=8 << 20)
    big = (bytes(range(1, 256)) * 8300)[:2 << 20]  # 2 MiB, no NUL (drain splits on it)
    http_post(src.http_address, "/pub", big, topic=topic)
    publish(src, topic, [b"small-1", b"small-2"])
    http_post(dst.http_address, "/topic/create", topic=topic)
    http_post(dst.http_address, "/channel/create", topic=topic, channel="check")
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "--destination-max-msg-size", "4M", "-n", "3"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert count(dst, topic) == 3
    assert sorted(drain(dst, topic, "check"), key=len) == [b"small-1", b"small-2", big]


@pytest.fixture
def laid_out(tmp_path):
    """nsqd laid out as by default (HTTP = TCP port + 1): its /config can be found from its TCP
    address. ``laid_out(*flags)`` starts one; all are stopped after the test."""
    boxes = []

    def start(*flags):
        boxes.append(default_layout_nsqd(tmp_path / f"box{len(boxes)}", *flags))
        return boxes[-1].nsqd

    yield start
    for sb in boxes:
        sb.stop()


BIG = (bytes(range(1, 256)) * 5900)[:1500000]  # 1.5 MB, no NUL (drain splits on it)


@pytest.mark.parametrize("layout", ["default", "any-port"])
def test_both_nsqd_at_3000000_copy_a_1_5_mb_message_without_any_flag(laid_out, nsqd_factory, topic, layout):
    """Issue 33: the 1.5 MB message was requeued for 15 min and then FINed, NOT copied, because
    --destination-max-msg-size guessed 1M. The destination's limit is asked of its /config
    (default layout) - or, where its HTTP port cannot be found, left to nsqd to judge."""
    if layout == "default":
        src, dst = laid_out("--max-msg-size=3000000"), laid_out("--max-msg-size=3000000")
    else:
        src, dst = nsqd_factory(max_msg_size=3000000), nsqd_factory(max_msg_size=3000000)
    http_post(src.http_address, "/pub", BIG, topic=topic)
    http_post(dst.http_address, "/topic/create", topic=topic)
    http_post(dst.http_address, "/channel/create", topic=topic, channel="check")
    t0 = time.monotonic()
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "-n", "1", "--timeout", "20s"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 10
    assert plain_lines(r.stderr.decode()) == ["nsqcli: copied 1, left out by filters 0, failed batches 0 (requeued), "
                                              + r.stderr.decode().rsplit("(requeued), ", 1)[1].strip()]
    assert drain(dst, topic, "check") == [BIG]
    ch = topic_stats(src, topic)["channels"][0]
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["message_count"]) == (0, 0, 0, 1)


def test_a_message_over_the_destination_limit_stays_in_the_source_said_once(laid_out, topic):
    """The destination's --max-msg-size (1 MB here, from its /config) is below the message: the
    small ones are copied, the big one is NOT FINed - it stays in the source, requeued, said in
    one line naming its size and the limit (not again per delivery)."""
    src, dst = laid_out("--max-msg-size=3000000"), laid_out("--max-msg-size=1000000")
    http_post(src.http_address, "/pub", BIG, topic=topic)
    publish(src, topic, [b"small-1", b"small-2"])
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "--requeue-delay", "0.2s", "--idle-timeout", "7s"], timeout=60)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    warnings = [ln for ln in plain_lines(err) if ln.startswith("nsqcli: warning:")]
    assert len(warnings) == 1, err
    assert "(1,500,000 bytes) is over the destination's 1,000,000-byte message limit (its --max-msg-size): not " \
           "copied; it stays in the source" in warnings[0]
    assert "copied 2," in err.splitlines()[-1] and "over the destination's message limit 1 (deliveries " in err
    assert count(dst, topic) == 2
    ch = topic_stats(src, topic)["channels"][0]
    assert ch["depth"] + ch["in_flight_count"] + ch["deferred_count"] == 1 and ch["requeue_count"] >= 2
    assert ch["message_count"] == 3


def test_a_limit_nsqd_tells_by_refusing_is_learnt_and_the_message_kept(nsqd_factory, topic):
    """The destination's HTTP port cannot be found: nsqd judges. Its "MPUB message too big"
    fails that batch once (requeued); the limit it named keeps the message out of later batches,
    and the message stays in the source."""
    src, dst = nsqd_factory(max_msg_size=3000000), nsqd_factory(max_msg_size=1000000)
    http_post(src.http_address, "/pub", BIG, topic=topic)
    publish(src, topic, [b"small-1", b"small-2"])
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "--requeue-delay", "0.2s", "--idle-timeout", "7s"], timeout=60)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "1,000,000-byte message limit (the destination nsqd said so): not copied; it stays in the source" in err
    assert set(drain(dst, topic, "check_after")) <= {b"small-1", b"small-2"}
    ch = topic_stats(src, topic)["channels"][0]
    assert ch["depth"] + ch["in_flight_count"] + ch["deferred_count"] == 1


def test_a_message_over_the_limit_is_fined_only_with_max_attempts(laid_out, topic):
    """--max-attempts N is the user asking to give up: after N deliveries FINed, said."""
    src, dst = laid_out("--max-msg-size=3000000"), laid_out()
    http_post(src.http_address, "/pub", BIG, topic=topic)
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "--max-attempts", "2", "--requeue-delay", "0.2s", "--idle-timeout", "7s"],
                   timeout=60)  # 7 s: nsqd looks at a new channel's deferred messages only every 5 s
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    warnings = [ln for ln in plain_lines(err) if ln.startswith("nsqcli: warning:")]
    assert len(warnings) == 2, err
    assert ("1,048,576-byte message limit (its --max-msg-size): not copied; requeued for 0.2s; it will be FINed "
            "(NOT copied) at delivery 2 (--max-attempts; this was delivery 1)") in warnings[0]
    assert "gave up on message" in warnings[1] and "after 2 attempts (--max-attempts)" in warnings[1]
    assert "given up 1" in err.splitlines()[-1]
    assert count(dst, topic) == 0
    ch = topic_stats(src, topic)["channels"][0]
    assert ch["depth"] == ch["in_flight_count"] == ch["deferred_count"] == 0  # FINed, as asked


@pytest.mark.parametrize("side", ["source", "destination"])
def test_timeout_with_a_hung_nsqlookupd(nsqd_factory, topic, side):
    """--timeout 3s is the whole command's: a hung nsqlookupd (accepts, never answers) ends it at
    3 s, not at a per-request timeout (5 s), exit 3 with one line - the copy was not done."""
    node = nsqd_factory()
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        h = f"127.0.0.1:{hung.getsockname()[1]}"
        where = (["--lookupd-http-address", h, "--destination-nsqd-tcp-address", node.tcp_address] if side == "source"
                 else ["--nsqd-tcp-address", node.tcp_address, "--destination-lookupd-http-address", h])
        t0 = time.monotonic()
        r = run_nsqcli(["to-nsq", "-t", topic, *where, "--destination-topic", topic + "_copy", "--timeout", "3s"],
                       timeout=30)
        took = time.monotonic() - t0
    one_error_line(r, 3, r"--timeout passed while .*nsqlookupd|--timeout passed while connecting to the source")
    # measured from outside: the interpreter's start is in it (up to ~1 s on a loaded machine)
    assert 2.8 <= took <= 4.5, took


def test_copying_a_topic_onto_itself_is_a_usage_error(sandbox, topic):
    nsqd = sandbox.nsqd
    lookupd = sandbox.lookupd.http_address
    cases = [
        ["--nsqd-tcp-address", nsqd.tcp_address, "--destination-nsqd-tcp-address", nsqd.tcp_address],
        ["--nsqd-tcp-address", nsqd.tcp_address, "--destination-nsqd-tcp-address", nsqd.tcp_address,
         "--destination-topic", topic],
        ["--lookupd-http-address", lookupd, "--destination-lookupd-http-address", f"http://{lookupd}/"],
    ]
    for args in cases:
        r = run_nsqcli(["to-nsq", "-t", topic, *args, "--idle-timeout", "1s"], timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nsqcli: error: to-nsq onto itself:"), lines
    assert topic_stats(nsqd, topic) is None  # refused before connecting: nothing was created
    # another topic on the same nsqd is fine
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--destination-nsqd-tcp-address",
                    nsqd.tcp_address, "--destination-topic", topic + "_copy", "--idle-timeout", "1s"], timeout=30)
    assert r.returncode == 0, r.stderr


def test_grep_and_where_copy_only_the_matching_messages(nsqd, topic):
    bodies = [b'{"level": "%s", "n": %d}' % (b"error" if i % 4 == 0 else b"info", i) for i in range(40)]
    http_post(nsqd.http_address, "/mpub", b"\n".join(bodies), topic=topic)
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--destination-nsqd-tcp-address",
                    nsqd.tcp_address, "--destination-topic", topic + "_errors", "--where", '.level == "error"',
                    "--grep", "n", "--idle-timeout", "1s", "--json"], timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["copied"], doc["filtered"]) == (10, 30)
    assert topic_stats(nsqd, topic + "_errors")["message_count"] == 10


# -- refusals: bad input, a footgun, grammar (one line, exit 2, nothing copied) ------------------------
from tests.support.refusals import DEAD, address_footgun, bad_input, grammar_row, ids  # noqa: E402

BAD_INPUT = [
    (["to-nsq", "-t", "t"], 2, r"give --destination-nsqd-tcp-address or --destination-lookupd-http-address"),
    (["to-nsq", "-t", "t", "--destination-nsqd-tcp-address", "h:1", "--require-json-value", "v"], 2,
     r"--require-json-value needs --require-json-field"),
    (["to-nsq", "-t", "t", "--destination-nsqd-tcp-address", "x"], 2, r"invalid address 'x': expected HOST:PORT"),
    (["to-nsq", "-t", "t", "--destination-nsqd-tcp-address", "h:1", "--mode", "random"], 2, r"'random' is not one of"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["to-nsq", "--destination-nsqd-tcp-address", DEAD], 2, r"missing TOPIC \(nsqcli to-nsq TOPIC\.\.\."),
    (["to-nsq", "x", "--timeout", "0"], 2, r"'--timeout': must be more than 0"),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)


ADDRESS_FOOTGUNS = [
    ({}, ["to-nsq", "-t", "{t}_src", "--nsqd-tcp-address", "{tcp}", "--destination-nsqd-tcp-address", "tcp://{tcp}",
          "--destination-topic", "{t}"], r"'--destination-nsqd-tcp-address': .*drop the scheme: {tcp}"),
]


@pytest.mark.parametrize("env,args,pattern", ADDRESS_FOOTGUNS, ids=ids(ADDRESS_FOOTGUNS, at=1, width=50))
def test_address_footgun_is_refused_naming_the_fix(nsqd, topic, env, args, pattern):
    address_footgun(nsqd, topic, env, args, pattern)


def test_a_batch_nsqd_refuses_part_way_is_copied_once_and_counted(nsqd_factory, topic):
    """The destination (--max-msg-size 100, its HTTP port unknown: nsqd judges) refuses one
    message of the batch after acknowledging the halves before it: those are FINed and counted,
    only the rest requeued. (The whole batch was requeued: the destination held 300 twice over
    while the summary said "copied 1".) The destination holds each message once and the summary
    says what it holds."""
    src, dst = nsqd_factory(), nsqd_factory(max_msg_size=100)
    bodies = [b"m%05d" % i for i in range(600)]
    publish(src, topic, bodies[:300] + [b"B" * 200] + bodies[300:])
    http_post(dst.http_address, "/topic/create", topic=topic)
    http_post(dst.http_address, "/channel/create", topic=topic, channel="check")
    r = run_nsqcli(["to-nsq", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--destination-nsqd-tcp-address",
                    dst.tcp_address, "--requeue-delay", "30s", "--idle-timeout", "3s", "--json"], timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["copied"] == count(dst, topic) == 600, (doc, count(dst, topic))
    copied = drain(dst, topic, "check")
    assert sorted(copied) == bodies  # each once
    ch = topic_stats(src, topic)["channels"][0]
    assert ch["depth"] + ch["in_flight_count"] + ch["deferred_count"] == 1  # the big one stays in the source
