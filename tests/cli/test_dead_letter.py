"""Dead letters on to-http and to-nsq against real nsqd: after --max-attempts the message is in
the dead-letter topic (the envelope right) and FINed in the source; a dead-letter topic that
cannot be published to leaves the message in the source (REQ, said)."""

from __future__ import annotations

import json
import signal
import subprocess

from tests.support.fakes import HTTPEndpoint
from tests.support.helpers import NSQCLI, channel_stats, clean_env, http_get_json, http_post, run_nsqcli, topic_stats, wait_for


def _settled(nsqd, topic: str, channel: str, received: int | None = None) -> bool:
    """The channel exists, nothing in it or in flight (and it received ``received`` messages)."""
    c = channel_stats(nsqd, topic, channel)
    return (c is not None and c["in_flight_count"] == 0 and c["depth"] == 0
            and (received is None or c["message_count"] == received))


def _stop(p) -> tuple[bytes, bytes]:
    p.send_signal(signal.SIGTERM)
    try:
        return p.communicate(timeout=20)
    finally:
        p.kill()


def test_to_http_500_dead_letters_after_max_attempts(nsqd, topic):
    ep = HTTPEndpoint(lambda body, n: (500 if body.startswith(b"poison") else 200, {}, 0))
    try:
        http_post(nsqd.http_address, "/mpub", b"ok-1\npoison-1\nok-2\nok-3", topic=topic)
        dead = topic + "_dead"
        p = subprocess.Popen(NSQCLI + ["to-http", topic, "-c", "h", "--post", ep.url + "/in", "--max-attempts", "2",
                                       "--dead-letter-topic", dead, "--requeue-delay", "100ms", "--json",
                                       "--nsqd-tcp-address", nsqd.tcp_address],
                             env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: (topic_stats(nsqd, dead) or {}).get("message_count") == 1, timeout=20,
                     what="the dead letter")
            wait_for(lambda: _settled(nsqd, topic, "h"), timeout=10, what="the poison message FINed")
        finally:
            out, err = _stop(p)
        assert p.returncode == 0, err
        summary = json.loads(out.decode().splitlines()[-1])
        assert (summary["delivered"], summary["dead_lettered"], summary["failed_attempts"]) == (3, 1, 2)
        assert sorted(ep.bodies()) == [b"ok-1", b"ok-2", b"ok-3", b"poison-1", b"poison-1"]
        c = channel_stats(nsqd, topic, "h")
        assert (c["depth"], c["in_flight_count"], c["deferred_count"], c["requeue_count"], c["message_count"]) == (
            0, 0, 0, 1, 4)
        assert f"dead-lettered to topic {dead} after 2 attempts" in err.decode()
        t = run_nsqcli(["tail", dead, "-n", "1", "-f", "raw", "--timeout", "10s", "--nsqd-tcp-address",
                        nsqd.tcp_address])
        d = json.loads(t.stdout)
        assert (d["topic"], d["channel"], d["body"], d["attempts"]) == (topic, "h", "poison-1", 2)
        assert "500" in d["error"] and "--max-attempts 2" in d["error"]
    finally:
        ep.close()


def test_dead_letter_publish_refused_keeps_the_message(nsqd, topic):
    """A dead letter nsqd refuses (the envelope of a body that nearly fills --max-msg-size is over
    it: E_BAD_MESSAGE): that message is REQed, said, not FINed; a small one is dead-lettered."""
    ep = HTTPEndpoint(lambda body, n: (500, {}, 0))
    try:
        http_post(nsqd.http_address, "/pub", b"poison", topic=topic)
        big = b"x" * (int(http_get_json(nsqd.http_address, "/config/max_msg_size")) - 20)
        http_post(nsqd.http_address, "/pub", big, topic=topic)
        dead = topic + "_dead"
        p = subprocess.Popen(NSQCLI + ["to-http", topic, "-c", "h", "--post", ep.url + "/in", "--max-attempts", "1",
                                       "--dead-letter-topic", dead, "--requeue-delay", "100ms",
                                       "--nsqd-tcp-address", nsqd.tcp_address],
                             env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: (topic_stats(nsqd, dead) or {}).get("message_count") == 1, timeout=20,
                     what="the small one dead-lettered")
            wait_for(lambda: channel_stats(nsqd, topic, "h")["requeue_count"] >= 1, timeout=20,
                     what="the big one requeued")
        finally:
            out, err = _stop(p)
        assert p.returncode == 0, err
        text = err.decode()
        assert "cannot publish the dead letter of message" in text and "NOT FINed" in text, text
        c = channel_stats(nsqd, topic, "h")
        assert c["depth"] + c["deferred_count"] + c["in_flight_count"] == 1  # the big one is still there
        assert topic_stats(nsqd, dead)["message_count"] == 1
    finally:
        ep.close()


def test_to_nsq_dead_letters_a_message_the_destination_cannot_take(nsqd, topic):
    big = "x" * 300
    http_post(nsqd.http_address, "/mpub", f"a\n{big}\nb".encode(), topic=topic)
    copy, dead = topic + "_copy", topic + "_dead"
    p = subprocess.Popen(NSQCLI + ["to-nsq", topic, "-c", "n", "--destination-nsqd-tcp-address", nsqd.tcp_address,
                                   "--destination-topic", copy, "--destination-max-msg-size", "100",
                                   "--max-attempts", "2", "--dead-letter-topic", dead, "--requeue-delay", "100ms",
                                   "--json", "--nsqd-tcp-address", nsqd.tcp_address],
                         env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (topic_stats(nsqd, dead) or {}).get("message_count") == 1, timeout=20,
                 what="the dead letter")
        wait_for(lambda: _settled(nsqd, topic, "n"), timeout=10, what="the big message FINed")
    finally:
        out, err = _stop(p)
    assert p.returncode == 0, err
    summary = json.loads(out.decode().splitlines()[-1])
    assert (summary["copied"], summary["dead_lettered"], summary["given_up"]) == (2, 1, 0)
    assert topic_stats(nsqd, copy)["message_count"] == 2
    c = channel_stats(nsqd, topic, "n")
    assert (c["depth"], c["in_flight_count"], c["deferred_count"], c["requeue_count"]) == (0, 0, 0, 1)
    t = run_nsqcli(["tail", dead, "-n", "1", "-f", "raw", "--timeout", "10s", "--nsqd-tcp-address", nsqd.tcp_address])
    d = json.loads(t.stdout)
    assert (d["topic"], d["channel"], d["body"], d["attempts"]) == (topic, "n", big, 2)
    assert "over the destination's 100-byte message limit" in d["error"]


def test_dead_letter_topic_needs_max_attempts():
    for cmd in (["exec", "t", "-c", "c", "--dead-letter-topic", "d", "--", "true"],
                ["to-http", "t", "--post", "http://127.0.0.1:1/", "--dead-letter-topic", "d"],
                ["to-nsq", "t", "--destination-nsqd-tcp-address", "127.0.0.1:1", "--dead-letter-topic", "d"]):
        r = run_nsqcli(cmd)
        assert r.returncode == 2, (cmd, r.stderr)
        assert r.stderr.decode().splitlines() == [
            f"nsqcli: error: --dead-letter-topic needs --max-attempts N (the attempt after which a message is "
            f"dead-lettered) (see 'nsqcli {cmd[0]} --help')"], r.stderr


def test_exec_through_lookupd_dead_letters_on_the_source_nsqd(nsqd, lookupd, topic):
    from tests.support.helpers import lookup_producers

    http_post(nsqd.http_address, "/pub", b"never", topic=topic)
    wait_for(lambda: lookup_producers(lookupd, topic), timeout=10, what="the topic registered")
    dead = topic + "_dead"
    r = run_nsqcli(["exec", topic, "-c", "w", "--max-attempts", "1", "--dead-letter-topic", dead, "-n", "1",
                    "--timeout", "20s", "--lookupd-http-address", lookupd.http_address, "--", "false"], timeout=40)
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, dead)["message_count"] == 1
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (0, 0, 0)


def test_to_http_max_attempts_alone_gives_up_said(nsqd, topic):
    ep = HTTPEndpoint(lambda body, n: (500, {}, 0))
    try:
        http_post(nsqd.http_address, "/pub", b"poison", topic=topic)
        p = subprocess.Popen(NSQCLI + ["to-http", topic, "-c", "h", "--post", ep.url + "/in", "--max-attempts", "1",
                                       "--log-format", "plain", "--nsqd-tcp-address", nsqd.tcp_address],
                             env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: _settled(nsqd, topic, "h", received=1), timeout=20, what="the message FINed")
        finally:
            out, err = _stop(p)
        assert p.returncode == 0, err
        assert "gave up on message" in err.decode() and "FINed, NOT delivered" in err.decode(), err
        assert channel_stats(nsqd, topic, "h")["requeue_count"] == 0 and len(ep.requests) == 1
    finally:
        ep.close()


def test_nsqd_hanging_during_the_dead_letter_publish_loses_nothing(nsqd, topic, tmp_path):
    """The command stops nsqd (SIGSTOP) and fails: the dead letter's PUB goes to a hung nsqd.
    When nsqd comes back 2 s later the publish completes and only then is the message FINed:
    one dead letter, nothing left in the source, exit 0."""
    import os
    import time

    http_post(nsqd.http_address, "/pub", b"poison", topic=topic)
    dead = topic + "_dead"
    once = tmp_path / "stopped"
    p = subprocess.Popen(NSQCLI + ["exec", topic, "-c", "w", "--max-attempts", "1", "--dead-letter-topic", dead,
                                   "-n", "1", "--timeout", "30s", "--nsqd-tcp-address", nsqd.tcp_address, "--", "sh",
                                   "-c", f"[ -e {once} ] || {{ touch {once}; kill -STOP {nsqd.pid}; }}; exit 1"],
                         env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: once.exists(), timeout=20, what="the command ran and stopped nsqd")
        time.sleep(2.0)  # the dead letter's PUB is waiting on the hung nsqd now
        assert p.poll() is None
        os.kill(nsqd.pid, signal.SIGCONT)
        out, err = p.communicate(timeout=30)
    finally:
        os.kill(nsqd.pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    assert b"dead-lettered to topic " + dead.encode() in err
    assert topic_stats(nsqd, dead)["message_count"] == 1
    wait_for(lambda: _settled(nsqd, topic, "w", received=1), timeout=10, what="the source FINed")
    assert channel_stats(nsqd, topic, "w")["requeue_count"] == 0
