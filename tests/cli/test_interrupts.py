"""Ctrl-C while a server accepts the connection and never answers (a handshake or an HTTP
request that would hang until its timeout): every command stops at once with exit 130 and one
line on stderr, as `pub` does."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.support.fakes import FakeNsqd
from tests.support.helpers import NSQCLI, clean_env, http_post, topic_stats, wait_for


def _silent(peer) -> None:
    peer.silence(60)  # reads nothing, answers nothing


COMMANDS = {
    "pub": lambda a, b, tmp: ["pub", "-t", "x", "hello", "--nsqd-tcp-address", a],
    "mpub": lambda a, b, tmp: ["mpub", "-t", "x", "--nsqd-tcp-address", a],
    "tail": lambda a, b, tmp: ["tail", "-t", "x", "--nsqd-tcp-address", a],
    "to-file": lambda a, b, tmp: ["to-file", "-t", "x", "--output-dir", str(tmp), "--nsqd-tcp-address", a],
    "to-nsq": lambda a, b, tmp: ["to-nsq", "-t", "x", "--nsqd-tcp-address", a,
                                 "--destination-nsqd-tcp-address", b],
    "to-http": lambda a, b, tmp: ["to-http", "-t", "x", "--nsqd-tcp-address", a, "--post", f"http://{b}/"],
    "stat": lambda a, b, tmp: ["stat", "--nsqd-http-address", a],
    "lookup": lambda a, b, tmp: ["lookup", "--lookupd-http-address", a],
    "doctor": lambda a, b, tmp: ["doctor", "--nsqd-tcp-address", a, "--nsqd-http-address", a],
    "wait": lambda a, b, tmp: ["wait", "--ready", "--nsqd-http-address", a],
    "check": lambda a, b, tmp: ["check", "--nsqd-http-address", a],
    "exec": lambda a, b, tmp: ["exec", "-t", "x", "-c", "c", "--nsqd-tcp-address", a, "--", "true"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_ctrl_c_while_the_server_never_answers_stops_at_once(name, tmp_path):
    with FakeNsqd(_silent) as silent, FakeNsqd(_silent) as other:
        proc = subprocess.Popen(NSQCLI + COMMANDS[name](silent.address, other.address, tmp_path),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=clean_env())
        try:
            if name == "mpub":
                proc.stdin.write(b"a\nb\n")
                proc.stdin.flush()
            wait_for(lambda: silent.connections > 0 or proc.poll() is not None, 30, what="a connection")
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)  # inside the handshake / the request now
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=4)  # the handshake timeout is 5 s
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    lines = err.decode().splitlines()
    assert proc.returncode == 130, err
    assert len(lines) == 1 and lines[0].startswith("nsqcli: interrupted (SIGINT)"), lines
    assert out == b""


@pytest.mark.parametrize("name", ["stat", "tail"])
def test_a_signal_the_parent_ignores_stays_ignored(name, nsqd, topic):
    """A job started with `&` in a script, or under `trap '' INT`, inherits SIGINT ignored: the
    command's clean-stop handler must not take it back (SIGTERM still stops it)."""
    http_post(nsqd.http_address, "/topic/create", topic=topic)  # a row for stat to print
    argv = (["stat", "-t", topic, "--no-live", "--interval", "0.2s", "--nsqd-http-address", nsqd.http_address]
            if name == "stat"
            else ["tail", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address])
    proc = subprocess.Popen(NSQCLI + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        # at work, so past start-up: the command's own handlers are installed (a fixed sleep could
        # end before that on a busy machine, and the SIGINT then tested nothing)
        if name == "stat":
            assert proc.stdout.readline(), proc.communicate()  # its first report
        else:
            wait_for(lambda: proc.poll() is not None or any(ch["client_count"] for ch in
                                                            (topic_stats(nsqd, topic) or {}).get("channels") or []),
                     15, what="tail subscribed")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # SIGTERM's clean stop: 0, or for stat, when it came during a request to nsqd (a request is
    # not waited out: stat.py's stopper.call), interrupted with the line that says so
    if name == "stat" and proc.returncode == 128 + signal.SIGTERM:
        assert err.decode().splitlines()[-1].startswith("nsqcli: interrupted (SIGTERM)"), err
    else:
        assert proc.returncode == 0, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_after_the_clean_stop_still_exits_with_128_plus_n(nsqd, topic, sig):
    """mpub stopped cleanly on the first signal and said so; a second one landing while the
    process exits (the interpreter's teardown puts back the default dispositions) killed it by
    the signal (-2/-15) instead of 130/143. A few tries, the second signal at a random moment
    around the last line."""
    import random

    from tests.support.helpers import topic_stats

    rng = random.Random()
    codes = []
    deadline = time.monotonic() + 20
    for attempt in range(8):
        if time.monotonic() > deadline:
            break
        t = f"{topic}_{attempt}"
        proc = subprocess.Popen(NSQCLI + ["mpub", "-t", t, "--nsqd-tcp-address", nsqd.tcp_address],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=clean_env())
        try:
            proc.stdin.write(b"a\nb\n")
            proc.stdin.flush()
            wait_for(lambda: (topic_stats(nsqd, t) or {}).get("message_count") == 2, 15, what="2 records in nsqd")
            proc.send_signal(sig)
            last = proc.stderr.readline()  # the summary: the clean stop is done, the process exits
            while b"interrupted" not in last and last:
                last = proc.stderr.readline()
            time.sleep(rng.uniform(0, 0.03))
            if proc.poll() is None:
                proc.send_signal(sig)
            _, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert b"interrupted" in last, (last, err)
        codes.append(proc.returncode)
    assert codes and all(c in (130, 143) for c in codes), codes


# A signal handled while the main thread is inside Event.wait() on the event the handler sets
# (the harness's wait loop, stat's interval, the sandbox's loop): the handler runs between two
# bytecodes, where Event.wait may hold the event's non-reentrant lock. Setting the event there
# waited for ever (a to-http still running 30 s after SIGTERM, once in CI).
LOCKED = {
    "GracefulStop": "from nsqcli.cli.signals import GracefulStop\n"
                    "GracefulStop(done).install((signal.SIGTERM,))\n",
    "stop_on_signals": "from nsqcli.cli.app import stop_on_signals\n"
                       "stop_on_signals(done, (signal.SIGTERM,))\n",
}


@pytest.mark.parametrize("how", sorted(LOCKED))
def test_a_signal_inside_event_wait_still_stops_the_run(how):
    import sys

    script = ("import os, signal, threading\ndone = threading.Event()\n" + LOCKED[how]
              + "with done._cond:  # where Event.wait() holds it for a few bytecodes every wait\n"
                "    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs right here, the lock held\n"
                "print('stopping', done.wait(5), flush=True)\n")
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, env=clean_env(), timeout=10)
    except subprocess.TimeoutExpired:
        raise AssertionError("the signal handler waited for ever for the lock its own thread holds") from None
    assert r.stdout == b"stopping True\n", r.stderr


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_second_signal_forces_the_exit_with_its_own_code(sig, code):
    """stop_on_signals (sandbox, to-parquet), as GracefulStop (the others): the second signal's forced exit is 128 + its number, like GracefulStop's (it was
    130 for a SIGTERM too), and says which signal."""
    import sys

    script = ("import os, signal, threading\nfrom nsqcli.cli.app import stop_on_signals\n"
              "done = threading.Event()\nstop_on_signals(done)\n"
              f"os.kill(os.getpid(), signal.{sig})\nos.kill(os.getpid(), signal.{sig})\n"
              "import time; time.sleep(5)\nprint('not forced')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, env=clean_env(), timeout=10)
    assert (r.returncode, r.stderr) == (code, f"nsqcli: forced exit ({sig})\n".encode()), (r.returncode, r.stderr)


def test_a_setter_whose_thread_could_not_start_still_sets_the_events(monkeypatch):
    """A start that failed ("can't start new thread" under a pids limit; a KeyboardInterrupt in
    an embedding) must not leave SETTER believing it has a thread: the next command's signal
    would post its event to nobody, and its clean stop would never come."""
    import threading

    from nsqcli.cli.setter import Setter

    setter = Setter()
    real = threading.Thread.start

    def boom(self):
        monkeypatch.setattr(threading.Thread, "start", real)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", boom)
    with pytest.raises(RuntimeError):
        setter.start()
    setter.start()  # the next command in this process
    ev = threading.Event()
    setter.post(ev)  # what its signal handler does
    assert ev.wait(5)


# A job whose start() spins on a lock, as a to-file starting 200 topics takes the timer
# thread's: a SIGTERM from another thread while it spins. Raised inside the start (in the main
# thread, as it was), the signal's exception landed between two bytecodes of threading's own
# code once in a while, after the lock was taken and before the `with` that frees it: a to-file
# still running 30 s after SIGTERM (CI), its timer thread's lock held by nobody alive.
SPINNING_START = r"""
import os, signal, sys, threading, time
from nsqcli.cli.app import App
from nsqcli.exits import Interrupted
from nsqcli.cli.harness import Job, Settings, run

cond = threading.Condition()
seen = []

class Spinning(Job):
    name = "spin"

    def start(self, deadline, stopper):
        try:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
            end = time.monotonic() + 5
            while time.monotonic() < end and not self.done.is_set():
                with cond:
                    pass
            seen.append("start ended" if self.done.is_set() else "start not told")
        except BaseException as e:
            seen.append(f"{type(e).__name__} inside start")
            raise

    def connected(self):
        return CONNECTED

    def stop(self, end):
        seen.append("lock free" if cond.acquire(timeout=2) else "lock held")

try:
    code = run(App(), Spinning(), Settings(status_interval=0, log_format="plain"))
except Interrupted as e:
    code = 128 + e.signum
print(code, seen)
"""


@pytest.mark.parametrize("connected, code", [(True, 0), (False, 143)])
def test_a_signal_during_a_start_never_raises_inside_it(connected, code):
    """The start runs on a thread of its own (nsqcli.cli.signals): it is told (``done``), ends
    at its next check, and the run ends with the clean stop (a connection up) or 143 (none),
    the start's lock free for stop()."""
    import sys

    script = SPINNING_START.replace("CONNECTED", str(connected))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, env=clean_env(), timeout=30)
    assert r.stdout.decode() == f"{code} ['start ended', 'lock free']\n", (r.stdout, r.stderr)


def sigint_once(cmd: list, ready, what: str, timeout: float = 15) -> tuple[int, bytes, float]:
    """Start ``cmd``, SIGINT it once ``ready()``; (its exit code, its stderr, the seconds from
    the signal to its exit)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    try:
        wait_for(lambda: proc.poll() is not None or ready(), 30, what=what)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("name", ["to-file", "to-nsq"])
def test_a_signal_while_a_lookupd_hangs_the_start_stops_at_once_and_quietly(name, nsqd, topic, tmp_path):
    """Connected to nsqd while its lookupd never answers: the start is still in its lookup (up
    to 5 s). A signal ends that lookup at once (review: 3.8 s later, and its "no complete
    answer" warning printed after the signal), then the clean stop: exit 0, nothing else said."""
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    with FakeNsqd(_silent) as lookupd:
        argv = {"to-file": ["to-file", "-t", topic, "--output-dir", str(tmp_path)],
                "to-nsq": ["to-nsq", "-t", topic, "--destination-nsqd-tcp-address", nsqd.tcp_address,
                           "--destination-topic", topic + "_copy"]}[name]
        def ready():  # RDY sent: the client has its SUB's answer, so it counts itself connected (nsqd
            # counts it at the SUB: under load a signal then found nothing connected yet - 130, CI68)
            channels = (topic_stats(nsqd, topic) or {}).get("channels") or []
            return lookupd.connections > 0 and any(cl["ready_count"] > 0 for c in channels for cl in c["clients"])

        code, err, took = sigint_once(NSQCLI + argv + ["--nsqd-tcp-address", nsqd.tcp_address, "--lookupd-http-address",
                                                       lookupd.address, "--status-interval", "0"],
                                      ready, "a connection to nsqd and one to the lookupd")
    text = err.decode()
    assert code == 0, text
    assert took < 4.0, (took, text)  # the lookup (begun just before the signal) not waited out: 5 s
    assert "lookup" not in text and "WARNING" not in text, text


@pytest.mark.parametrize("name", ["exec", "to-http"])
def test_a_signal_during_the_dead_letter_lookup_stops_at_once(name):
    """--dead-letter-topic asks the lookupd for the source's nsqd before any consumer exists:
    a signal there ended the run only after the start's grace (1 s, review), not at once."""
    with FakeNsqd(_silent) as lookupd, FakeNsqd(_silent) as other:
        common = ["-t", "x", "-c", "c", "--lookupd-http-address", lookupd.address, "--max-attempts", "3",
                  "--dead-letter-topic", "dl"]
        argv = {"exec": ["exec", *common, "--", "true"],
                "to-http": ["to-http", *common, "--post", f"http://{other.address}/"]}[name]
        code, err, took = sigint_once(NSQCLI + argv, lambda: lookupd.connections > 0, "the lookup")
    assert (code, err) == (130, b"nsqcli: interrupted (SIGINT)\n"), err
    assert took < 0.9, took  # not START_ABORT (1 s): the lookup ended at the signal


@pytest.mark.parametrize("cmd, code", [("stat", 0), ("mpub", 129)])
def test_a_terminal_that_hangs_up_ends_a_live_view_as_its_sighup(nsqd, topic, tmp_path, cmd, code):
    """The terminal itself goes (ssh dropped, the window closed): the command gets SIGHUP and its
    live view or progress bar can no longer be cleared (EIO). It stops as SIGHUP says - stat
    cleanly (0), mpub with its resume line (129, the line lost with the terminal) - instead of
    exit 1 "Input/output error" from the last redraw (review)."""
    import os
    import pty
    import select

    records = tmp_path / "records"
    records.write_bytes(b"r\n" * 100_000)
    args = (["stat", "--nsqd-http-address", nsqd.http_address, "--interval", "0.5"] if cmd == "stat" else
            ["mpub", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--rate", "200"])
    env = clean_env({"TERM": "xterm", "COLUMNS": "120", "LINES": "40"})
    pid, master = pty.fork()
    if pid == 0:  # the child: a session of its own, the pty its controlling terminal (stdin, stdout, stderr)
        try:
            if cmd == "mpub":
                os.dup2(os.open(records, os.O_RDONLY), 0)
            os.execve(NSQCLI[0], NSQCLI + args, env)
        finally:
            os._exit(127)
    def going() -> bool:  # the view is up and drawing; mpub has published
        return len(drawn) >= 200 and (cmd == "stat" or (topic_stats(nsqd, topic) or {}).get("message_count", 0) > 0)

    drawn = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not going():
        if select.select([master], [], [], 0.1)[0]:
            try:
                drawn += os.read(master, 65536)
            except OSError:
                break
    os.close(master)  # the hangup
    rc = None
    deadline = time.monotonic() + 20
    while rc is None and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        rc = os.waitstatus_to_exitcode(status) if done else time.sleep(0.05)
    if rc is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert going(), drawn
    assert rc == code, (rc, drawn[-300:])
    if cmd == "mpub":
        assert 0 < topic_stats(nsqd, topic)["message_count"] < 100_000
