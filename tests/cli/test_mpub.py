"""`nsqcli mpub` against REAL nsqd with limits smaller than the client assumes, and interrupted
at random moments: the count it prints, its exit code and its resume hint are always exactly
what nsqd's /stats holds."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from helpers import NSQCLI, clean_env, run_nsqcli, topic_stats, wait_for


def _held(nsqd, topic: str) -> int:
    t = topic_stats(nsqd, topic)
    return t["message_count"] if t else 0


def _lines(n: int, big=range(0)) -> bytes:
    return b"".join(b"r%07d-" % i + (b"y" * 900 if i in big else b"x" * 40) + b"\n" for i in range(n))


def test_a_smaller_max_body_size_is_learned_and_every_record_published_once(nsqd_factory, topic):
    server = nsqd_factory(max_body_size=100_000)  # nsqd does not tell clients its limit
    r = run_nsqcli(["mpub", "-t", topic, "--json", "--nsqd-tcp-address", server.tcp_address],
                   input=_lines(20_000, big=range(8_000, 9_000)), timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["published"], doc["failed"], doc["resume_skip"]) == (20_000, 0, 20_000)
    assert _held(server, topic) == 20_000  # not 16,500 reported / 17,500 held; no duplicates


def test_the_one_record_over_max_msg_size_is_named_and_everything_before_it_published(nsqd_factory, topic):
    server = nsqd_factory(max_msg_size=1000)  # mpub assumes 1 MiB: only nsqd can refuse it
    data = _lines(3_000, big=range(0)).replace(b"r0001234-" + b"x" * 40, b"r0001234-" + b"z" * 2000)
    r = run_nsqcli(["mpub", "-t", topic, "--json", "--nsqd-tcp-address", server.tcp_address], input=data,
                   timeout=60)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["published"] == 1234 and doc["resume_skip"] == 1234 and _held(server, topic) == 1234
    err = r.stderr.decode()
    assert "record 1235 refused by nsqd" in err and "E_BAD_MESSAGE MPUB message too big 2009 > 1000" in err
    assert "resume with --skip 1234 (--skip 1235 also leaves out record 1235)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("seed", range(6))
def test_an_interrupted_mpub_says_exactly_where_to_resume(nsqd, topic, seed):
    """SIGINT/SIGTERM at a random moment: the hint equals what nsqd holds (it was a batch short
    in 5 of 26 runs), and resuming with it publishes every record exactly once."""
    rng = random.Random(seed)
    n = 300_000
    data = _lines(n)
    proc = subprocess.Popen(NSQCLI + ["mpub", "-t", topic, "--json", "--rate", "200000",
                                      "--nsqd-tcp-address", nsqd.tcp_address],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    delay = rng.uniform(0.0, 0.9)

    def interrupt():  # at a random moment once publishing has begun (not during start-up,
        wait_for(lambda: _held(nsqd, topic) > 0, 30, 0.01, "the first batch")  # however slow)
        time.sleep(delay)
        proc.send_signal(sig)

    import threading

    threading.Thread(target=interrupt, daemon=True).start()
    out, err = proc.communicate(data, timeout=60)
    held = _held(nsqd, topic)
    if proc.returncode == 0:  # finished before the signal: nothing to resume
        assert json.loads(out)["published"] == n == held
        return
    assert proc.returncode == 128 + sig, err
    doc = json.loads(out)
    assert doc["published"] == held and doc["resume_skip"] == held, (doc, held)
    assert f"resume with --skip {held}".encode() in err and b"Traceback" not in err
    r = run_nsqcli(["mpub", "-t", topic, "--skip", str(doc["resume_skip"]), "--nsqd-tcp-address",
                    nsqd.tcp_address], input=data, timeout=60)
    assert r.returncode == 0, r.stderr
    assert wait_for(lambda: _held(nsqd, topic) == n, 5, what="every record exactly once")


@pytest.mark.parametrize("seed", [2, 9, 12])
def test_tiny_limits_and_one_record_over_them_count_exactly(nsqd_factory, topic, seed):
    """nsqd --max-body-size=3000 --max-msg-size=500, 20,000 mixed records, one over 500 bytes:
    after the body limit is learned the re-split ledger holds hundreds of small batches; they
    go out a window at a time (all at once, nsqd's OKs queued up unread and the reset that
    follows its E_BAD_MESSAGE destroyed some: 195 reported while nsqd held 830)."""
    rng = random.Random(seed)
    records = []
    for i in range(20_000):
        n = rng.choice([rng.randint(1, 20), rng.randint(1, 500)])
        head = b"%d:" % i
        records.append((head + b"x" * n)[:max(n, len(head))])
    big = rng.randint(200, 3000)
    records[big] = b"%d:" % big + b"y" * 520
    server = nsqd_factory(max_body_size=3000, max_msg_size=500)
    r = run_nsqcli(["mpub", "-t", topic, "--json", "--nsqd-tcp-address", server.tcp_address],
                   input=b"\n".join(records) + b"\n", timeout=60)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and f"record {big + 1} refused by nsqd" in r.stderr.decode(), r.stderr
    assert doc["published"] == doc["resume_skip"] == big == _held(server, topic)


def _streaming_mpub(nsqd, topic, *args):
    return subprocess.Popen(NSQCLI + ["mpub", "-t", topic, "--json", "--nsqd-tcp-address", nsqd.tcp_address,
                                      *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())


def test_records_from_a_pipe_that_stays_open_reach_nsqd_within_the_linger(nsqd, topic):
    """`tail -F app.log | nsqcli mpub`: three records, stdin still open - they are in nsqd now,
    not once 500 (a batch) have piled up or the pipe closes."""
    proc = _streaming_mpub(nsqd, topic)
    try:
        proc.stdin.write(b"one\ntwo\nthree\n")
        proc.stdin.flush()
        wait_for(lambda: _held(nsqd, topic) == 3, 15, what="3 records in nsqd while stdin is open")
        assert proc.poll() is None  # still reading
        proc.stdin.write(b"four\n")
        proc.stdin.flush()
        wait_for(lambda: _held(nsqd, topic) == 4, 15, what="the 4th record, later")
    finally:
        out, err = proc.communicate(timeout=30)  # closes stdin
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert (doc["published"], doc["failed"], doc["resume_skip"]) == (4, 0, 4) and _held(nsqd, topic) == 4


def test_an_interrupt_while_the_pipe_is_quiet_counts_the_lingered_records(nsqd, topic):
    proc = _streaming_mpub(nsqd, topic, "--linger", "10ms")
    proc.stdin.write(b"a\nb\nc\npartial")
    proc.stdin.flush()
    wait_for(lambda: _held(nsqd, topic) == 3, 15, what="3 records in nsqd")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert (doc["published"], doc["resume_skip"]) == (3, 3) and _held(nsqd, topic) == 3
    assert b"resume with --skip 3" in err and b"Traceback" not in err
