"""nsqcli bench on a real nsqd: its counts cross-checked against nsqd's /stats."""

from __future__ import annotations

import time
import json

from tests.support.helpers import http_post, run_nsqcli, topic_stats, wait_for
from tests.support.inprocess import run_in_process


def bench(nsqd, *args):
    r = run_nsqcli(["bench", *args, "--json", "--nsqd-tcp-address", nsqd.tcp_address], timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_pubsub_counts_match_nsqd(nsqd, topic):
    doc = bench(nsqd, "pubsub", "-t", topic, "-n", "20000", "--size", "64")
    assert doc["pub"]["messages"] == doc["sub"]["messages"] == 20000
    t = topic_stats(nsqd, topic)
    ch = t["channels"][0]
    assert t["message_count"] == 20000 and ch["channel_name"] == "nsqcli_bench"
    assert (ch["message_count"], ch["depth"], ch["in_flight_count"]) == (20000, 0, 0)
    lat = doc["sub"]["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"] < 60_000
    assert abs(doc["pub"]["mb_per_sec"] - doc["pub"]["msgs_per_sec"] * 64 / 1e6) < 0.01


def test_processes_and_per_client_rows(nsqd, topic):
    doc = bench(nsqd, "pub", "-t", topic, "-n", "5000", "--publishers", "2", "--processes")
    assert [c["messages"] for c in doc["pub"]["clients"]] == [5000, 5000]
    assert topic_stats(nsqd, topic)["message_count"] == 10000
    other = topic + "_sub"
    http_post(nsqd.http_address, "/topic/create", topic=other)
    http_post(nsqd.http_address, "/channel/create", topic=other, channel="b2")
    bench(nsqd, "pub", "-t", other, "-n", "3000")
    doc = bench(nsqd, "sub", "-t", other, "-c", "b2", "-n", "3000", "--consumers", "2")
    assert doc["sub"]["messages"] == 3000 and sum(c["messages"] for c in doc["sub"]["clients"]) == 3000
    ch = next(c for c in topic_stats(nsqd, other)["channels"] if c["channel_name"] == "b2")
    assert ch["depth"] == 0 and ch["message_count"] == 3000


def test_duration_and_failures(nsqd, topic):
    doc = bench(nsqd, "pub", "-t", topic, "--duration", "1s", "--size", "16")
    assert doc["pub"]["messages"] == topic_stats(nsqd, topic)["message_count"] > 0
    assert 0.9 <= doc["pub"]["seconds"] <= 5
    r = run_nsqcli(["bench", "pub", "-n", "10", "--nsqd-tcp-address", "127.0.0.1:1"])
    assert r.returncode == 1 and r.stderr.decode().startswith("nsqcli: error: 1 bench client(s) failed: ")
    assert b"Traceback" not in r.stderr
    r = run_in_process(["bench", "pub", "-n", "10", "--duration", "1s"])
    assert r.returncode == 2 and b"give --count or --duration, not both" in r.stderr


def test_a_thread_consumer_with_many_latencies_reports_and_exits(nsqd, topic):
    """A consumer thread's result with 300k latencies comes back whole. (Through a
    multiprocessing queue, pickled by a feeder thread, such a result could still be on its way
    when the thread had ended: bench gave up waiting, then hung at exit joining the feeder -
    seen once in make bench at 1M; a race this test does not force.)"""
    n = 300_000
    bench(nsqd, "pub", "-t", topic, "-n", str(n), "--size", "16")
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="many")
    doc = bench(nsqd, "sub", "-t", topic, "-c", "many", "-n", str(n))
    assert doc["sub"]["messages"] == n and doc["sub"]["latency_ms"]["max"] > 0


def test_timeout_counts_from_process_start(nsqd, topic):
    """`bench sub` of an empty topic: exit 3 when --timeout has passed since the command started."""
    t0 = time.monotonic()
    r = run_nsqcli(["bench", "sub", "-t", topic, "-n", "5", "--timeout", "1500ms", "--nsqd-tcp-address", nsqd.tcp_address])
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert r.stderr.decode().strip().splitlines()[-1] == "nsqcli: error: --timeout passed before 'bench sub' was done"
    assert 1.4 < took < 2.2, took


# -- refusals: bad input, grammar, a deadline (one line, the documented exit code) ----------------------
import pytest  # noqa: E402
from tests.support.refusals import DEAD, bad_input, grammar_row, ids, refused  # noqa: E402

BAD_INPUT = [
    (["bench", "pub", "--size", "4"], 2, r"'--size': 4 is not in the range 8<=x<=1048576"),
    (["bench", "pub", "-n", "5", "--duration", "1s"], 2, r"give --count or --duration, not both"),
    (["bench", "pub", "-n", "5", "--nsqd-tcp-address", DEAD], 1, r"1 bench client\(s\) failed: .*Connection refused"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["bench", "sub", "a", "-t", "b"], 2, r"TOPIC given twice"),
    (["bench", "pub", "a", "c", "-c", "d"], 2, r"CHANNEL given twice"),
    (["bench", "sub", "--timeout", "0"], 2, r"'--timeout': must be more than 0"),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)


@pytest.mark.parametrize("clients", [[], ["--processes", "--consumers", "2"]], ids=["threads", "processes"])
def test_bench_sub_timeout_exits_3(nsqd, topic, clients):
    """One line, exit 3 (review: with --processes, each child added "interrupted (SIGTERM)" as
    the exit ended it: they had the parent's early signal handler)."""
    http_post(nsqd.http_address, "/pub", b"x" * 16, topic=topic)  # the topic exists, 1 message of 5
    r = run_nsqcli(["bench", "sub", topic, "-n", "5", "--timeout", "2s", "--nsqd-tcp-address", nsqd.tcp_address]
                   + clients)
    refused(r, 3, r"--timeout passed before 'bench sub' was done")


def test_bench_timeout_while_the_lookupd_hangs_exits_3():
    """A lookup cut short by --timeout is the deadline (exit 3), not "no nsqlookupd answered"
    (exit 1, review)."""
    from tests.support.fakes import FakeNsqd

    with FakeNsqd(lambda peer: peer.silence(60)) as lookupd:
        r = run_nsqcli(["bench", "pub", "bench_lookup", "--lookupd-http-address", lookupd.address, "--timeout", "1s"])
    refused(r, 3, r"--timeout passed before 'bench pub' was done")


def test_processes_started_with_sigint_ignored_keep_ignoring_it(nsqd, topic):
    """`nsqcli bench ... --processes &` in a script ignores SIGINT, and so must its clients: a
    Ctrl-C on the script's terminal (the whole group) ended every client with KeyboardInterrupt
    (review: exit 1, "4 bench client(s) failed"). Expected: exit 0 and the report."""
    import os
    import signal
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env

    def ignore_int():
        os.setpgrp()
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    p = subprocess.Popen(NSQCLI + ["bench", "pubsub", topic, "--processes", "--publishers", "2", "--consumers", "2",
                                   "--duration", "3s", "--nsqd-tcp-address", nsqd.tcp_address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(), preexec_fn=ignore_int)
    try:
        wait_for(lambda: (topic_stats(nsqd, topic) or {}).get("message_count", 0) > 0, 20, what="messages")
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 0 and b"Pub:" in out and b"Sub:" in out, (out, err)


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    import os

    kids = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            st = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        state, ppid = st[st.rfind(")") + 2:].split()[:2]
        if int(ppid) == pid and state != "Z":
            kids.append(int(d))
    return kids


def _alive(pid: int) -> bool:
    try:
        st = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return st[st.rfind(")") + 2:].split()[0] != "Z"  # a zombie (not reaped by pid 1 here) has ended


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_processes_end_with_the_bench_signalled_alone(nsqd, topic, sig):
    """`kill PID` or kill -9 of the bench alone (not its process group, as a supervisor or a
    script's `kill $!` does): its --processes clients end with it, where they went on publishing
    until their --duration."""
    import os
    import signal
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env

    p = subprocess.Popen(NSQCLI + ["bench", "pubsub", topic, "--processes", "--publishers", "2", "--consumers", "1",
                                   "--duration", "60s", "--nsqd-tcp-address", nsqd.tcp_address],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env(), start_new_session=True)
    kids: list[int] = []
    try:
        wait_for(lambda: (topic_stats(nsqd, topic) or {}).get("message_count", 0) > 0, 20, what="messages")
        kids = _children(p.pid)
        assert len(kids) == 3, kids
        p.send_signal(getattr(signal, sig))
        p.wait(30)
        wait_for(lambda: not any(map(_alive, kids)), 5, what="every client ended with the bench")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for k in filter(_alive, kids):
            os.kill(k, signal.SIGKILL)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_the_whole_group_signalled_says_interrupted_once(nsqd, topic, sig):
    """A terminal's hangup (or Ctrl-C, or `kill -- -PGID`) reaches the bench and its --processes
    clients at once: one line, the bench's, and 128 + the signal (review: on SIGHUP each client
    said "interrupted (SIGHUP)" too, 4 lines for 3 clients)."""
    import os
    import signal
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env

    p = subprocess.Popen(NSQCLI + ["bench", "pubsub", topic, "--processes", "--publishers", "2", "--consumers", "1",
                                   "--duration", "60s", "--nsqd-tcp-address", nsqd.tcp_address],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env(), start_new_session=True)
    try:
        wait_for(lambda: (topic_stats(nsqd, topic) or {}).get("message_count", 0) > 0, 20, what="messages")
        assert len(_children(p.pid)) == 3
        os.killpg(p.pid, getattr(signal, sig))
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    said = [ln for ln in err.decode().splitlines() if "interrupted" in ln]
    assert p.returncode == 128 + getattr(signal, sig) and len(said) == 1, err.decode()
    assert said[0].startswith(f"nsqcli: interrupted ({sig})"), said


def test_only_the_clients_bench_forks_are_made_clients():
    """The fork hook acts on bench's own client forks only (review): in a process embedding
    nsqcli, a fork of its own keeps its signal handlers, and a child that then runs a bench
    gets working clients (the hook had kept the first parent's pid: each client exited 1)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import multiprocessing as mp, os, signal
        from nsqcli.cli.commands import bench
        signal.signal(signal.SIGTERM, lambda *a: None)
        bench._quiet_children()
        pid = os.fork()
        if pid == 0:  # the embedding program's own fork
            kept = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
            client = mp.get_context("fork").Process(target=print, args=("client ran",))
            bench._start([client], "pub", 0, None, bench._Late("pub", None))  # as the bench starts its clients
            client.join()
            print("kept" if kept else "reset", client.exitcode, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == ["client ran", "kept 0"], (r.stdout, r.stderr)
