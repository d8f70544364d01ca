"""Breaks an operator found in the daemons (issue 35's review), each against real nsqd and the
real executable: what a user sees (exit codes, stderr lines, files, /metrics answers)."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import time
import urllib.request

from tests.support.helpers import NSQCLI, channel_stats, clean_env, finished, http_post, wait_for

from nsqcli.sandbox import free_port


def run(args, timeout=30, env=None):
    return subprocess.run(NSQCLI + args, capture_output=True, timeout=timeout, env=clean_env(env))


def test_metrics_address_port_0_serves_on_a_free_port_and_colon_port_is_accepted(nsqd, topic):
    """Port 0 (any free port, said in the log) and ":PORT" (every interface, as node_exporter's
    --web.listen-address) were refused as 'invalid address ... expected HOST:PORT', exit 2."""
    # tail ends 0 when its --timeout passes once subscribed, 3 when before: 4 s covers a busy
    # machine's start-up, the pre-checks and the handshake
    r = run(["tail", topic, "-c", "c", "--nsqd-tcp-address", nsqd.tcp_address, "--timeout", "4",
             "--metrics-address", "127.0.0.1:0", "--log-format", "text"])
    err = r.stderr.decode()
    assert r.returncode == 0, err
    m = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", err)
    assert m and int(m.group(1)) > 0, err

    from nsqcli.cli.types import LISTEN_ADDRESS

    assert LISTEN_ADDRESS.convert(":9117", None, None) == ":9117"  # (not bound here: loopback only)
    assert LISTEN_ADDRESS.convert("[::1]:0", None, None) == "[::1]:0"
    r = run(["tail", topic, "--metrics-address", "127.0.0.1:99999", "--timeout", "1"])
    assert r.returncode == 2 and b"99999" in r.stderr and b"Traceback" not in r.stderr, r.stderr


def test_status_file_that_is_a_device_or_a_pipe_is_refused_not_replaced(nsqd, topic, tmp_path):
    """--status-file /dev/stdout (as root) replaced the /dev/stdout symlink by a regular file:
    the status file is written by rename, so a path that is not a regular file is refused."""
    link = tmp_path / "stdout"
    link.symlink_to("/dev/null")  # what /dev/stdout is, without touching /dev
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (link, fifo):
        r = run(["tail", topic, "-c", "c", "--nsqd-tcp-address", nsqd.tcp_address, "--timeout", "1",
                 "--status-file", str(path)])
        err = r.stderr.decode()
        assert r.returncode == 2, err
        assert err.count("\n") == 1 and str(path) in err and "regular file" in err, err
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert fifo.is_fifo()
    r = run(["tail", topic, "--status-file", "", "--timeout", "1"])
    assert r.returncode == 2 and b"empty" in r.stderr, r.stderr


def test_status_file_directory_removed_mid_run_one_plain_warning_and_the_work_goes_on(nsqd, topic, tmp_path):
    folder = tmp_path / "st"
    folder.mkdir()
    path = folder / "s.json"
    p = subprocess.Popen(NSQCLI + ["tail", topic, "-c", "c", "--nsqd-tcp-address", nsqd.tcp_address,
                                   "--status-file", str(path), "--idle-timeout", "30"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    try:
        wait_for(path.exists, timeout=10, what="the first status file")
        path.unlink()
        folder.rmdir()
        time.sleep(6)  # the next write is due 5 s after the first
        http_post(nsqd.http_address, "/pub", b"after", topic=topic)
        # shown and FINed (tail writes a message before it FINs it), not merely sent
        wait_for(lambda: p.poll() is not None or finished(nsqd, topic, "c") == 1, timeout=10, what="the message FINed")
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
    err = err.decode()
    assert p.returncode == 0, err
    assert out == b"after\n"
    warnings = [ln for ln in err.splitlines() if "status file" in ln]
    assert len(warnings) == 1, err
    assert warnings[0].count(str(path)) == 1 and warnings[0].count("cannot write") == 1, warnings[0]
    assert "No such file or directory" in warnings[0] and "the work goes on" in warnings[0]


def test_log_format_json_the_exit_line_is_json_too(nsqd, topic):
    """With --log-format json every stderr line is one JSON object: also the last one, the
    error that gives the exit code (it was a plain 'nsqcli: error: ...' line)."""
    dead = f"127.0.0.1:{free_port()}"
    cases = [(["to-http", "-t", topic, "--post", f"http://{dead}/x", "--nsqd-tcp-address", nsqd.tcp_address,
               "-n", "1", "--timeout", "1.5"], 3, "--timeout passed"),
             (["tail", topic, "-c", "c", "--nsqd-tcp-address", dead, "--timeout", "5"], 1, "cannot connect")]
    http_post(nsqd.http_address, "/pub", b"one", topic=topic)
    for args, code, text in cases:
        r = run(args + ["--log-format", "json"])
        lines = r.stderr.decode().splitlines()
        assert r.returncode == code, lines
        docs = [json.loads(ln) for ln in lines]  # each line a JSON object
        assert docs and docs[-1]["level"] == "error" and text in docs[-1]["message"], docs
        assert docs[-1]["exit_code"] == code and docs[-1]["event"] == "exit"


def healthz(address) -> int:
    try:
        with urllib.request.urlopen("http://%s:%d/healthz" % address, timeout=2) as r:
            return r.status
    except OSError:
        return 0


def test_a_burst_of_scrapers_is_not_dropped(nsqd, topic):
    """The metrics server listened with a backlog of 5: 40 scrapers at once (the process busy
    for a moment, here SIGSTOPped) had 34 connections dropped, retried by the kernel 1-3 s later."""
    address = ("127.0.0.1", free_port())
    p = subprocess.Popen(NSQCLI + ["tail", topic, "-c", "c", "--nsqd-tcp-address", nsqd.tcp_address,
                                   "--metrics-address", "%s:%d" % address, "--idle-timeout", "30"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env())
    socks = []
    try:
        wait_for(lambda: healthz(address) == 200, timeout=15, what="serving")
        # subscribed: a SIGTERM while tail still starts (its checks, the handshake) is exit 143,
        # not the clean stop this test ends with (seen on a busy machine)
        wait_for(lambda: (channel_stats(nsqd, topic, "c") or {}).get("clients"), timeout=15, what="subscribed")
        os.kill(p.pid, signal.SIGSTOP)
        for _ in range(40):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(address)
            socks.append(s)
        time.sleep(0.3)
        _, writable, _ = select.select([], socks, [], 0)
        connected = [s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]
        os.kill(p.pid, signal.SIGCONT)
        assert len(connected) == 40
        for s in socks:
            s.setblocking(True)
            s.settimeout(5)
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        for s in socks:
            assert s.recv(64).startswith(b"HTTP/1.0 200"), "a scrape not answered"
    finally:
        for s in socks:
            s.close()
        os.kill(p.pid, signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
    assert p.returncode == 0


def test_lag_is_not_shown_from_a_node_that_is_gone(nsqd_factory, topic):
    """With every connection gone (nsqd killed) the status line kept saying 'lag: 0 messages
    waiting in nsqd (1 nsqd)' - the last depth seen - for the whole outage."""
    from nsqcli.cli.harness import Harness, Job, Settings
    from nsqcli.client import limits
    from nsqcli.client.consumer import Consumer

    src = nsqd_factory()
    http_post(src.http_address, "/topic/create", topic=topic)
    http_post(src.http_address, "/channel/create", topic=topic, channel="c")
    http_post(src.http_address, "/mpub", b"a\nb\nc", topic=topic)
    limits.note_http(src.tcp_address, src.http_address)
    consumer = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[src.tcp_address])

    class OneConsumer(Job):
        def consumers(self):
            return [consumer]

    h = Harness(None, OneConsumer(), Settings())
    consumer.start()
    try:
        def poll():
            h._lag_due = 0.0
            h._poll_lag(time.monotonic(), wanted=True)
            if h._lag_thread is not None:
                h._lag_thread.join(10)
            return h._lag_lines()

        assert wait_for(poll, timeout=10, what="a lag line")[0].startswith("lag: ")
        src.kill()
        wait_for(lambda: not any(st.connected_at for st in consumer.stats()), timeout=10, what="disconnected")
        assert poll() == [] and h.depth == []
    finally:
        consumer.stop(timeout=2)


def test_live_on_a_terminal_too_small_says_so(nsqd, topic):
    """--live where no live view fits said "(not TERM=dumb, not a pipe)" on an xterm of 30x5."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 5, 30, 0, 0))
    p = subprocess.Popen(NSQCLI + ["tail", topic, "-c", "c", "--nsqd-tcp-address", nsqd.tcp_address, "--live",
                                   "--timeout", "1"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
                         env=clean_env({"TERM": "xterm-256color", "COLUMNS": "", "LINES": ""}))
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 10)
        try:
            data = os.read(master, 4096) if ready else b""
        except OSError:
            data = b""
        if not data:
            break
        out += data
    os.close(master)
    assert p.wait(timeout=10) == 0, out
    assert b"the terminal is 30x5" in out and b"not TERM=dumb" not in out, out
