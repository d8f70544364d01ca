"""nsqcli exec against a real nsqd: FIN on exit 0, REQ on failure, dead letters after
--max-attempts (the envelope, the counts in /stats of both topics, the redrive), kill -9
loses nothing, --command-timeout kills the process group, TOUCH keeps a long run's message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.support.helpers import NSQCLI, channel_stats, clean_env, http_post, run_nsqcli, topic_stats, wait_for
from tests.support.inprocess import run_in_process

SCRIPT = ('b=$(cat); case "$b" in *bad*) echo "no good: $b" >&2; exit 1;; esac; '
          'echo "$NSQ_TOPIC $NSQ_CHANNEL $NSQ_ATTEMPTS $b"')


def test_good_fined_once_bad_dead_lettered_and_redriven(nsqd, topic, tmp_path):
    good = [f"good-{i:02d}" for i in range(20)]
    bad = ["bad-1", "bad-2", "bad-3"]
    http_post(nsqd.http_address, "/mpub", "\n".join(good[:10] + bad + good[10:]).encode(), topic=topic)
    dead = topic + "_dead"
    r = run_nsqcli(["exec", topic, "-c", "work", "--concurrency", "4", "--max-attempts", "2", "--dead-letter-topic",
                    dead, "--requeue-delay", "100ms", "-n", "23", "--timeout", "40s", "--json",
                    "--nsqd-tcp-address", nsqd.tcp_address, "--", "sh", "-c", SCRIPT], timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    out = r.stdout.decode().splitlines()
    summary = json.loads(out[-1])
    assert sorted(out[:-1]) == sorted(f"{topic} work 1 {g}" for g in good)  # each good one once, first attempt
    assert (summary["succeeded"], summary["dead_lettered"], summary["runs"]) == (20, 3, 26)
    c = channel_stats(nsqd, topic, "work")
    assert (c["depth"], c["in_flight_count"], c["deferred_count"], c["message_count"], c["requeue_count"],
            c["timeout_count"]) == (0, 0, 0, 23, 3, 0)
    assert topic_stats(nsqd, dead)["message_count"] == 3
    assert err.count(f"dead-lettered to topic {dead} after 2 attempts: exit code 1") == 3, err
    assert sorted(ln for ln in err.splitlines() if ln.startswith("no good")) == sorted(f"no good: {b}" for b in bad * 2)
    # the dead letters, read back, then redriven into a topic of their own with mpub --format json
    t = run_nsqcli(["tail", dead, "-c", "redrive", "-n", "3", "-f", "raw", "--timeout", "10s",
                    "--nsqd-tcp-address", nsqd.tcp_address])
    assert t.returncode == 0, t.stderr
    letters = [json.loads(line) for line in t.stdout.decode().splitlines()]
    assert sorted(d["body"] for d in letters) == bad
    for d in letters:
        assert (d["topic"], d["channel"], d["attempts"], d["error"]) == (
            topic, "work", 2, f"exit code 1 (attempt 2 of --max-attempts 2): no good: {d['body']}")
        assert len(d["id"]) == 16 and d["timestamp"] > 0 and d["nsqd"] == nsqd.tcp_address
    (tmp_path / "dead.ndjson").write_bytes(t.stdout)
    again = topic + "_again"
    m = run_nsqcli(["mpub", "-t", again, "-f", "json", str(tmp_path / "dead.ndjson"),
                    "--nsqd-tcp-address", nsqd.tcp_address])
    assert m.returncode == 0, m.stderr
    back = run_nsqcli(["tail", again, "-n", "3", "-f", "raw", "--timeout", "10s", "--nsqd-tcp-address",
                       nsqd.tcp_address])
    assert sorted(back.stdout.decode().splitlines()) == bad


def test_binary_body_dead_letter_is_base64_and_give_up_code(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"\xff\xfe bin", topic=topic)
    dead = topic + "_dead"
    r = run_nsqcli(["exec", topic, "-c", "w", "--max-attempts", "5", "--dead-letter-topic", dead,
                    "--give-up-exit-code", "65", "-n", "1", "--timeout", "20s",
                    "--nsqd-tcp-address", nsqd.tcp_address, "--", "sh", "-c", "cat >/dev/null; exit 65"], timeout=40)
    assert r.returncode == 0, r.stderr
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (0, 0, 0)  # no retry
    t = run_nsqcli(["tail", dead, "-n", "1", "-f", "raw", "--timeout", "10s", "--nsqd-tcp-address", nsqd.tcp_address])
    d = json.loads(t.stdout)
    assert d["body_base64"] == "//4gYmlu" and "body" not in d
    assert d["error"] == "exit code 65 (--give-up-exit-code)" and d["attempts"] == 1


def test_the_command_starts_with_no_signal_blocked(nsqd, topic):
    """A COMMAND inherits the mask of the thread that spawns it: with the consumer started on a
    thread born with SIGINT/SIGTERM/SIGHUP/SIGALRM blocked (review), `timeout 1 sleep 4` slept
    4 s and a COMMAND's own alarm() never fired."""
    import sys

    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    r = run_nsqcli(["exec", topic, "-c", "w", "-n", "1", "--timeout", "20s", "--nsqd-tcp-address", nsqd.tcp_address,
                    "--", sys.executable, "-c",
                    "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"],
                   timeout=40)
    assert r.returncode == 0 and r.stdout == b"[]\n", (r.stdout, r.stderr)


def test_kill_9_loses_nothing(nsqd, topic, tmp_path):
    bodies = [f"m{i:03d}" for i in range(40)]
    http_post(nsqd.http_address, "/mpub", "\n".join(bodies).encode(), topic=topic)
    seen = tmp_path / "seen"
    cmd = ["exec", topic, "-c", "w", "--concurrency", "4", "--msg-timeout", "1s", "--nsqd-tcp-address",
           nsqd.tcp_address, "--", "sh", "-c", f'b=$(cat); sleep 0.1; echo "$b" >> {seen}']
    p = subprocess.Popen(NSQCLI + cmd, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: seen.exists() and len(seen.read_text().split()) >= 8, timeout=20, what="a few runs")
        p.kill()  # SIGKILL: no stop, no FIN of what it holds
    finally:
        p.kill()
        p.wait(10)
    first = set(seen.read_text().split())
    assert 0 < len(first) < len(bodies)
    r = run_nsqcli(cmd[:4] + ["--idle-timeout", "4s", "--timeout", "40s"] + cmd[4:], timeout=60)
    assert r.returncode == 0, r.stderr
    assert set(seen.read_text().split()) == set(bodies)  # every message ran at least once
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0)


def test_command_timeout_kills_the_process_group(nsqd, topic, tmp_path):
    http_post(nsqd.http_address, "/pub", b"slow", topic=topic)
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    r = run_nsqcli(["exec", topic, "-c", "w", "--command-timeout", "500ms", "--max-attempts", "1", "-n", "1",
                    "--timeout", "20s", "--nsqd-tcp-address", nsqd.tcp_address, "--",
                    "sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"], timeout=40)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 10
    err = r.stderr.decode()
    assert "killed after --command-timeout 0.5s (attempt 1 of --max-attempts 1); FINed" in err, err
    pid = int(pidfile.read_text())
    wait_for(lambda: not _alive(pid), timeout=3, what="the sleep killed with its group")
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (0, 0, 0)


def test_a_run_ends_when_the_command_exits_not_when_its_background_child_does(nsqd, topic, tmp_path):
    """sh -c 'sleep 30 & echo queued': the sleep keeps the output pipes open; the run is over (and
    the message FINed) when sh exits, and the sleep, which is the command's, goes on running."""
    for i in range(2):
        http_post(nsqd.http_address, "/pub", b"m%d" % i, topic=topic)
    pids = tmp_path / "pids"
    started = time.monotonic()
    r = run_nsqcli(["exec", topic, "-c", "w", "-n", "2", "--timeout", "20s", "--nsqd-tcp-address", nsqd.tcp_address,
                    "--", "sh", "-c", f"sleep 30 & echo $! >> {pids}; echo queued; cat >/dev/null"], timeout=40)
    took = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"queued\nqueued\n"
    assert took < 10, took  # not 2 x 30 s
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"], c["message_count"]) == (0, 0, 0, 2)
    for pid in map(int, pids.read_text().split()):
        assert _alive(pid)
        os.kill(pid, signal.SIGKILL)


def test_a_body_larger_than_a_pipe_reaches_the_command_whole_or_not_at_all(nsqd, topic):
    """500 KB (a pipe holds 64 KB): wc -c reads it all; `true` reads none and exits (EPIPE on our
    side, not an error of the run)."""
    body = bytes(range(256)) * 2000
    base = ["exec", topic, "-c", "w", "-n", "1", "--timeout", "20s", "--nsqd-tcp-address", nsqd.tcp_address, "--"]
    http_post(nsqd.http_address, "/pub", body, topic=topic)  # one at a time: -n 1 gives back a second one
    r = run_nsqcli(base + ["wc", "-c"], timeout=40)
    assert r.returncode == 0 and r.stdout.strip() == str(len(body)).encode(), r.stderr
    http_post(nsqd.http_address, "/pub", body, topic=topic)
    r = run_nsqcli(base + ["true"], timeout=40)
    assert r.returncode == 0 and r.stdout == b"", r.stderr
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"]) == (0, 0, 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_touch_keeps_a_long_run_and_failures_requeue(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"long", topic=topic)
    r = run_nsqcli(["exec", topic, "-c", "w", "--msg-timeout", "1s", "-n", "1", "--timeout", "20s",
                    "--requeue-delay", "100ms", "--nsqd-tcp-address", nsqd.tcp_address, "--",
                    "sh", "-c", 'cat >/dev/null; [ "$NSQ_ATTEMPTS" = 2 ] || { sleep 2.5; exit 3; }; echo ok'],
                   timeout=40)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"ok\n"
    assert "the command failed: exit code 3" in r.stderr.decode()
    c = channel_stats(nsqd, topic, "w")  # 2.5 s with a 1 s msg timeout: TOUCHed, not timed out
    assert (c["timeout_count"], c["requeue_count"], c["depth"], c["in_flight_count"]) == (0, 1, 0, 0)


def test_sigterm_waits_for_the_running_command(nsqd, topic, tmp_path):
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    mark = tmp_path / "started"
    p = subprocess.Popen(NSQCLI + ["exec", topic, "-c", "w", "--nsqd-tcp-address", nsqd.tcp_address, "--",
                                   "sh", "-c", f"touch {mark}; sleep 1; cat"],
                         env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(mark.exists, timeout=15, what="the command started")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert out == b"x"
    # the FIN went out before the exit; nsqd may read it a moment later (a lost one would hold the
    # message in flight for its 60 s timeout)
    wait_for(lambda: channel_stats(nsqd, topic, "w")["in_flight_count"] == 0, timeout=5, what="FINed")
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["requeue_count"], c["timeout_count"]) == (0, 0, 0)


def test_timeout_short_exits_3_and_closed_stdout_ends_quietly(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"a\nb", topic=topic)
    started = time.monotonic()
    r = run_nsqcli(["exec", topic, "-c", "w", "-n", "5", "--timeout", "3s", "--nsqd-tcp-address", nsqd.tcp_address,
                    "--", "cat"], timeout=30)
    assert r.returncode == 3, r.stderr
    assert time.monotonic() - started < 3 + 4  # process start included; a busy machine
    assert r.stderr.decode().splitlines()[-1] == "nsqcli: error: --timeout passed after 2 of 5 messages done"
    assert sorted(r.stdout) == sorted(b"ab")
    http_post(nsqd.http_address, "/mpub", b"1\n2\n3\n4\n5\n6", topic=topic)
    script = (" ".join(NSQCLI) + f" exec {topic} -c w --nsqd-tcp-address {nsqd.tcp_address} --timeout 20s -- "
              "sh -c 'cat; echo' | head -n 1; echo \"rc=${PIPESTATUS[0]}\" >&2")
    p = subprocess.run(["bash", "-c", script], env=clean_env(), capture_output=True, timeout=30)
    assert p.stdout in (b"1\n", b"2\n", b"3\n", b"4\n", b"5\n", b"6\n")
    err = p.stderr.decode()
    assert err.splitlines()[-1] == "rc=0" and "Traceback" not in err and "error" not in err, err


def test_concurrency_runs_side_by_side_and_each_runs_output_stays_whole(nsqd, topic, tmp_path):
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"r%d" % i for i in range(8)), topic=topic)
    log = tmp_path / "log"
    script = (f'b=$(cat); echo "start $b" >> {log}; echo "$b one"; sleep 0.4; echo "$b two"; sleep 0.4; '
              f'echo "$b three"; echo "end $b" >> {log}')
    r = run_nsqcli(["exec", topic, "-c", "w", "--concurrency", "4", "-n", "8", "--timeout", "30s",
                    "--nsqd-tcp-address", nsqd.tcp_address, "--", "sh", "-c", script], timeout=60)
    assert r.returncode == 0, r.stderr
    running = most = 0
    for line in log.read_text().splitlines():
        running += 1 if line.startswith("start") else -1
        most = max(most, running)
    assert 2 <= most <= 4, log.read_text()
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 24
    for i in range(0, 24, 3):  # one run's three lines together, though 4 ran at once
        b = lines[i].split()[0]
        assert lines[i:i + 3] == [f"{b} one", f"{b} two", f"{b} three"], lines


def test_usage_errors_are_one_line_exit_2():
    from tests.support.helpers import one_error_line

    cases = [
        (["exec", "t", "-c", "c", "grep", "-v", "bad"], r"put -- before COMMAND \(.* -- grep bad \.\.\.\)"),
        (["exec", "t", "-c", "c", "--", "no-such-command-here"], r"command not found: 'no-such-command-here'"),
        (["exec", "t", "--", "cat"], r"missing CHANNEL"),
        (["exec", "t", "-c", "c", "--max-attempts", "2", "--dead-letter-topic", "t", "--", "cat"],
         r"--dead-letter-topic t is the topic being consumed"),
        (["exec", "t", "-c", "c", "--command-timeout", "0", "--", "cat"], r"'--command-timeout': must be more than 0"),
    ]
    for args, pattern in cases:
        one_error_line(run_in_process(args), 2, pattern)


def _on_a_terminal(args) -> tuple[int, bytes]:
    """Run nsqcli with stdout and stderr on one pseudo-terminal: (exit code, what it showed)."""
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(NSQCLI + args, env=clean_env({"TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}),
                             stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
        code = p.wait(30)
        os.close(slave)
        slave = None
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed and everything was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    return code, seen


def test_on_a_terminal_no_live_table_by_default_and_live_refused(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"hello", topic=topic)
    code, seen = _on_a_terminal(["exec", topic, "-c", "w", "-n", "1", "--timeout", "20s",
                                 "--nsqd-tcp-address", nsqd.tcp_address, "--", "cat"])
    assert code == 0, seen
    assert b"hello" in seen and b"ran 1: succeeded 1" in seen
    assert b"\x1b[" not in seen, seen  # no table drawn over COMMAND's output
    code, seen = _on_a_terminal(["exec", topic, "-c", "w", "--live", "--nsqd-tcp-address", nsqd.tcp_address,
                                 "--", "cat"])
    assert code == 2 and b"--live draws on the terminal that also gets COMMAND's output" in seen, seen


def test_timeout_kills_a_running_command_and_gives_its_message_back(nsqd, topic, tmp_path):
    http_post(nsqd.http_address, "/pub", b"slow", topic=topic)
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    # 4 s: the message delivered and the command started before the deadline on a busy machine
    r = run_nsqcli(["exec", topic, "-c", "w", "--timeout", "4s", "--nsqd-tcp-address", nsqd.tcp_address, "--",
                    "sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"], timeout=40)
    took = time.monotonic() - started
    assert r.returncode == 0, r.stderr  # no -n: a --timeout is the planned end
    assert took < 4 + 3, took
    wait_for(lambda: not _alive(int(pidfile.read_text())), timeout=3, what="the sleep killed with its group")
    # the REQ is the last frame exec writes, unanswered: nsqd may read it a moment after the exit
    wait_for(lambda: channel_stats(nsqd, topic, "w")["in_flight_count"] == 0, timeout=5, what="given back")
    c = channel_stats(nsqd, topic, "w")  # given back at once, not FINed, not left to time out (60 s)
    assert (c["depth"], c["in_flight_count"], c["requeue_count"], c["timeout_count"]) == (1, 0, 1, 0)


# -- refusals: bad input (one line, the documented exit code, nothing consumed) --------------------------
import pytest  # noqa: E402
from tests.support.refusals import DEAD, bad_input, ids  # noqa: E402

BAD_INPUT = [
    (["exec", "t", "-c", "c"], 2, r"missing COMMAND \(nsqcli exec \[TOPIC\] -- COMMAND \[ARG\]\.\.\.\)"),
    (["exec", "t", "-c", "c", "sh", "-c", "x"], 2, r"--channel given twice \(-c 'c', then -c 'x'\)"),
    (["exec", "t", "--", "true"], 2, r"missing CHANNEL"),
    (["exec", "t", "-c", "c", "--concurrency", "0", "--", "true"], 2, r"'--concurrency': 0 is not in the range"),
    (["exec", "t", "-c", "c", "--", "/nonexistent/x"], 2, r"'/nonexistent/x' is not an executable file"),
    (["exec", "t", "-c", "c", "--", "nosuchcmd_zz"], 2, r"command not found: 'nosuchcmd_zz' \(not in PATH\)"),
    (["exec", "t", "-c", "c", "--command-timeout", "0", "--", "true"], 2, r"'--command-timeout': must be more"),
    (["exec", "t", "-c", "c", "--max-attempts", "2", "--dead-letter-topic", "t", "--", "true"], 2,
     r"--dead-letter-topic t is the topic being consumed"),
    (["exec", "t", "-c", "c", "--dead-letter-topic", "d", "--", "true"], 2, r"--dead-letter-topic needs --max-attempts"),
    (["exec", "t", "-c", "c", "--nsqd-tcp-address", DEAD, "--", "true"], 1, r"127\.0\.0\.1:1: cannot connect"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


# -- breaks of issue 36's everyday jobs found by trying them as a user would (each failed before its fix) --
from tests.support.helpers import run_nsqcli as run  # noqa: E402


def _env(nsqd) -> dict:
    return {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address}


def test_exec_with_n_taken_by_running_commands_holds_the_others_instead_of_a_requeue_loop(nsqd, topic):
    # exec -n 2 --concurrency 4: the 2 runs claimed -n; every other message delivered meanwhile was
    # REQ'd with no delay and came straight back, hundreds of times a second (requeue_count 3382
    # for 8 messages in half a second: their attempts, which --max-attempts counts, ruined)
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="work")
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(10)), topic=topic)
    r = run(["exec", topic, "-c", "work", "-n", "2", "--concurrency", "4", "--timeout", "20s", "--",
             "sh", "-c", "sleep 0.5; cat; echo"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2 and b"succeeded 2" in r.stderr, r.stderr
    wait_for(lambda: channel_stats(nsqd, topic, "work")["in_flight_count"] == 0, what="nothing in flight")
    ch = channel_stats(nsqd, topic, "work")
    # the loop made thousands; each held message given back once is 8. Under two test passes at
    # once a clean-clone run saw 92 (and 54, 24 in busy runs before the RDY 0 on -n done), which a
    # 1 s delay of that RDY 0, played in the executable, does not reproduce: not understood yet
    assert ch["depth"] == 8 and ch["requeue_count"] <= 200, ch
    r = run(["tail", topic, "-c", "work", "-n", "8", "-f", "{attempts}", "--timeout", "10s"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert max(int(a) for a in r.stdout.split()) <= 3, r.stdout


def test_exec_command_timeout_and_touch_still_apply_after_the_command_closes_its_output(nsqd, topic):
    # COMMAND closed its stdout and stderr and went on running: with no pipe left to watch the run
    # waited for its exit with no TOUCH and no --command-timeout (sleep 8 ran its 8 s; with a
    # shorter --msg-timeout nsqd timed the message out and redelivered it, E_REQ_FAILED after)
    import time

    http_post(nsqd.http_address, "/pub", b"m", topic=topic)
    started = time.monotonic()
    r = run(["exec", topic, "-c", "w", "--command-timeout", "500ms", "--max-attempts", "1", "-n", "1",
             "--timeout", "20s", "--", "sh", "-c", "exec >&- 2>&-; sleep 8"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 6, r.stderr
    assert b"killed after --command-timeout 0.5s (attempt 1 of --max-attempts 1); FINed" in r.stderr, r.stderr
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"], c["timeout_count"]) == (0, 0, 0, 0), (c, r.stderr)
