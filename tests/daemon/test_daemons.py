"""The daemons as an operator runs them, against real nsqd: /metrics checked against the archive
and nsqd's /stats, /healthz across an nsqd kill, the status file, systemd's notify socket, and
status lines where no live view can be drawn."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from tests.support.fakes import HTTPEndpoint
from tests.support.helpers import NSQCLI, channel_stats, clean_env, finished, http_post, signal_and_wait, wait_for
from prometheus_client.parser import text_string_to_metric_families

from nsqcli.sandbox import _die_with_parent, free_port

_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _reap():
    yield
    while _started:
        p = _started.pop()
        if p.poll() is None:
            p.kill()
        p.communicate()


def start(args, env=None):
    p = subprocess.Popen(NSQCLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env(env), preexec_fn=_die_with_parent)
    _started.append(p)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(ln.decode() for ln in iter(p.stderr.readline, b"")),
                              daemon=True)
    reader.start()
    p.lines = lines
    return p


def stop(p, sig=signal.SIGTERM, timeout: float = 30) -> bytes:
    """Signal the daemon and wait for its exit (its stdout); a hang fails the test with its
    stderr and stacks (signal_and_wait)."""
    out, _ = signal_and_wait(p, sig, timeout, said=lambda: "".join(p.lines))
    return out


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def samples(address: str) -> dict:
    """{(name, frozenset(labels)): value} of one scrape."""
    status, text = get(f"http://{address}/metrics")
    assert status == 200, text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(scrape: dict, name: str, **labels) -> float:
    found = [v for (n, ls), v in scrape.items() if n == name and set(labels.items()) <= set(ls)]
    assert found, f"{name} {labels} not in the scrape: {sorted({n for n, _ in scrape})}"
    return sum(found)


def seen(address: str, name: str, **labels) -> float | None:
    """The value in a new scrape, None while it is not there yet."""
    scrape = samples(address)
    found = [v for (n, ls), v in scrape.items() if n == name and set(labels.items()) <= set(ls)]
    return sum(found) if found else None


def test_to_file_metrics_match_the_archive_and_health_follows_nsqd(nsqd_factory, topic, tmp_path):
    src = nsqd_factory()
    out = tmp_path / "out"
    port = free_port()
    address = f"127.0.0.1:{port}"
    status_file = tmp_path / "status.json"
    bodies = [b"m%04d" % i for i in range(500)]
    http_post(src.http_address, "/mpub", b"\n".join(bodies), topic=topic)
    p = start(["to-file", "-t", topic, "--nsqd-tcp-address", src.tcp_address, "--output-dir", str(out),
               "--sync-interval", "0.2s", "--metrics-address", address, "--status-file", str(status_file)],
              env={"NSQCLI_OUTAGE_REMIND": "1s"})
    wait_for(lambda: get(f"http://{address}/healthz")[0] == 200, timeout=15, what="/healthz 200")
    wait_for(lambda: seen(address, "nsqcli_messages_finished_total", topic=topic) == 500,
             timeout=15, what="500 FINed")
    scrape = samples(address)
    on_disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    work = sum(f.stat().st_size for f in (out / ".work").rglob("*") if f.is_file()) if (out / ".work").is_dir() else 0
    stats = channel_stats(src, topic, "nsqcli_to_file")
    assert value(scrape, "nsqcli_messages_received_total", topic=topic) == 500
    assert stats["message_count"] == 500 and stats["depth"] == 0 and stats["in_flight_count"] == 0
    assert value(scrape, "nsqcli_bytes_written_total") == sum(len(b) + 1 for b in bodies)
    assert on_disk + work >= sum(len(b) + 1 for b in bodies)
    assert value(scrape, "nsqcli_fsyncs_total") >= 1
    assert value(scrape, "nsqcli_last_fsync_timestamp_seconds") > time.time() - 60
    assert value(scrape, "nsqcli_connection_up", nsqd=src.tcp_address) == 1
    assert value(scrape, "nsqcli_healthy") == 1
    def finished_in_file():  # replaced every 5 s
        doc = json.loads(status_file.read_text()) if status_file.exists() else {"topics": []}
        return doc if [t["finished"] for t in doc["topics"] if t["topic"] == topic] == [500] else None

    doc = wait_for(finished_in_file, timeout=12, what="the status file")
    assert doc["command"] == "to-file" and doc["pid"] == p.pid and doc["health"]["ok"]

    src.kill()  # SIGKILL: every source is down
    wait_for(lambda: get(f"http://{address}/healthz")[0] == 503, timeout=15, what="/healthz 503")
    status, reason = get(f"http://{address}/healthz")
    assert "every nsqd is down" in reason and src.tcp_address in reason, reason
    assert value(samples(address), "nsqcli_messages_received_total", topic=topic) == 500  # never reset
    assert not any("recovered" in ln for ln in p.lines), p.lines
    src.restart()
    http_post(src.http_address, "/pub", b"after", topic=topic)
    wait_for(lambda: get(f"http://{address}/healthz")[0] == 200, timeout=20, what="/healthz 200 again")
    wait_for(lambda: seen(address, "nsqcli_messages_finished_total", topic=topic) == 501,
             timeout=15, what="counters go on from 500")
    wait_for(lambda: any("recovered: source" in ln for ln in p.lines), timeout=10, what="the recovered line")
    assert sum("recovered: source" in ln for ln in p.lines) == 1, "".join(p.lines)
    stop(p)
    assert p.returncode == 0, p.lines
    assert json.loads(status_file.read_text())["state"] == "stopping"


def test_lag_is_the_channel_depth_nsqd_reports(nsqd, lookupd, topic, tmp_path):
    """nsqd found through nsqlookupd (its HTTP address with it): the channel's depth, as /stats says."""
    address = f"127.0.0.1:{free_port()}"
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"l%d" % i for i in range(30)), topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="audit")
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"k%d" % i for i in range(7)), topic=topic)
    # the 30 published before the channel existed waited in the topic and went to its first
    # channel: 37 there, 5 of them taken now, so that the depth (32) is not the message count (37)
    r = subprocess.run(NSQCLI + ["tail", topic, "-c", "audit", "-n", "5", "--nsqd-tcp-address", nsqd.tcp_address],
                       capture_output=True, timeout=30, env=clean_env())
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 5, r.stderr
    wait_for(lambda: (lambda c: c["depth"] == 32 and c["in_flight_count"] == 0 and c["message_count"] == 37)(
        channel_stats(nsqd, topic, "audit")), what="32 left in the channel")
    # paused, the channel delivers nothing, so its depth holds still while tail polls it (unpaused,
    # tail took from it before the first poll: how many depended on the machine's load)
    http_post(nsqd.http_address, "/channel/pause", topic=topic, channel="audit")
    p = start(["tail", topic, "-c", "audit", "--lookupd-http-address", lookupd.http_address, "--max-in-flight", "1",
               "--metrics-address", address, "-f", "{body}"], env={})
    wait_for(lambda: get(f"http://{address}/healthz")[0] == 200, timeout=15, what="serving")
    depth = ("nsqcli_channel_depth", frozenset({"command": "tail", "topic": topic, "channel": "audit",
                                                "nsqd": nsqd.tcp_address}.items()))
    scrape = wait_for(lambda: (lambda s: s if depth in s else None)(samples(address)), timeout=15, what="the lag poll")
    assert scrape[depth] == channel_stats(nsqd, topic, "audit")["depth"] == 32
    stop(p)
    assert p.returncode == 0, p.lines


def test_sd_notify_ready_watchdog_stopping(nsqd, topic, tmp_path):
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(10)
    p = start(["to-file", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(tmp_path / "o")],
              env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "400000"})
    got: list[str] = []
    try:
        while not any(d.startswith("READY=1") for d in got) or sum(d == "WATCHDOG=1" for d in got) < 3:
            got.append(sock.recv(4096).decode())
        assert any(f"MAINPID={p.pid}" in d for d in got), got
        p.send_signal(signal.SIGTERM)
        while not any(d.startswith("STOPPING=1") for d in got):
            got.append(sock.recv(4096).decode())
    finally:
        sock.close()
    p.communicate(timeout=30)
    assert p.returncode == 0, p.lines
    ready = next(i for i, d in enumerate(got) if d.startswith("READY=1"))
    assert "WATCHDOG=1" in got[ready:], got  # the watchdog only once the loop runs


def test_to_http_latency_counts_every_delivery(nsqd, topic):
    ep = HTTPEndpoint(None)
    address = f"127.0.0.1:{free_port()}"
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"x%d" % i for i in range(40)), topic=topic)
    p = start(["to-http", "-t", topic, "--post", ep.url, "--nsqd-tcp-address", nsqd.tcp_address,
               "--metrics-address", address])
    wait_for(lambda: len(ep.bodies()) == 40, timeout=20, what="40 delivered")
    wait_for(lambda: seen(address, "nsqcli_delivered_total") == 40, timeout=10, what="counted")
    scrape = samples(address)
    assert value(scrape, "nsqcli_delivery_latency_seconds_count") == 40
    assert value(scrape, "nsqcli_messages_finished_total", topic=topic) == 40
    stop(p)
    ep.close()
    assert p.returncode == 0, p.lines


def test_sigusr1_writes_every_threads_stack_and_the_daemon_goes_on(nsqd, topic):
    """A daemon that seems stuck says where each thread is (kill -USR1), and keeps working."""
    p = start(["tail", topic, "-c", "c", "--nsqd-tcp-address", nsqd.tcp_address, "-f", "{body}"])
    wait_for(lambda: channel_stats(nsqd, topic, "c") is not None, timeout=15, what="subscribed")
    p.send_signal(signal.SIGUSR1)
    wait_for(lambda: sum("Thread 0x" in ln for ln in p.lines) >= 2, timeout=10, what="the stacks")
    assert any("harness.py" in ln for ln in p.lines), "".join(p.lines)
    http_post(nsqd.http_address, "/pub", b"after the dump", topic=topic)
    wait_for(lambda: (lambda c: (c["message_count"], c["depth"], c["in_flight_count"]) == (1, 0, 0))(
        channel_stats(nsqd, topic, "c")), timeout=10, what="still consuming: shown and FINed")
    assert stop(p) == b"after the dump\n"
    assert p.returncode == 0, p.lines


def test_metrics_port_in_use_is_one_line_before_connecting(nsqd, topic, tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        address = "127.0.0.1:%d" % busy.getsockname()[1]
        r = subprocess.run(NSQCLI + ["to-nsq", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address,
                                     "--destination-nsqd-tcp-address", nsqd.tcp_address, "--destination-topic",
                                     topic + "_copy", "--metrics-address", address],
                           capture_output=True, env=clean_env(), timeout=30)
    finally:
        busy.close()
    assert r.returncode == 1
    lines = r.stderr.decode().splitlines()
    assert lines == [f"nsqcli: error: cannot serve metrics: cannot listen on {address}: "
                     "Address already in use"], lines


@pytest.mark.parametrize("command", ["to-file", "tail"])
def test_term_dumb_gives_status_lines_not_a_blank_screen(nsqd, topic, tmp_path, command):
    """On a terminal rich cannot drive (TERM=dumb) a live view is no view: status lines instead."""
    import pty

    http_post(nsqd.http_address, "/mpub", b"\n".join(b"d%d" % i for i in range(20)), topic=topic)
    args = {"to-file": ["to-file", "-t", topic, "--output-dir", str(tmp_path / "o")],
            "tail": ["tail", topic, "-c", "c", "--live"]}[command]
    master, slave = pty.openpty()
    env = clean_env({"TERM": "dumb", "COLUMNS": "120", "LINES": "40"})
    p = subprocess.Popen(NSQCLI + args + ["--nsqd-tcp-address", nsqd.tcp_address, "--status-interval", "0.5s"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL if command == "tail" else slave,
                         stderr=slave, env=env, preexec_fn=_die_with_parent)
    _started.append(p)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            chunks.append(data)
            text = b"".join(chunks).decode(errors="replace")
            if text.count("msg") >= 2 or text.count("messages (") >= 2:
                break
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert "\x1b[" not in text, repr(text)  # no cursor movement: lines
    if command == "to-file":
        assert f"topic {topic}: 20 messages" in text, text
    else:
        assert "shown 20" in text, text
        assert "status lines instead" in text, text


@pytest.mark.parametrize("command", ["tail", "to-http"])
def test_sighup_stops_cleanly_where_it_has_no_other_use(nsqd, topic, command):
    """A closed terminal or a `systemctl reload` of a relay: drained and stopped like SIGTERM
    (exit 0, every message shown or delivered FINed), not killed by the signal (129)."""
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"h%d" % i for i in range(10)), topic=topic)
    ep = HTTPEndpoint(None)
    args = {"tail": ["tail", topic, "-c", "c"], "to-http": ["to-http", "-t", topic, "--post", ep.url]}[command]
    p = start(args + ["--nsqd-tcp-address", nsqd.tcp_address])
    channel = "c" if command == "tail" else "nsq_to_http"
    # FINs counted per client: message_count 10 with nothing in flight also holds before the
    # first RDY, when none of the ten has been sent yet.
    wait_for(lambda: finished(nsqd, topic, channel) == 10, timeout=15, what="all 10 FINed")
    out = stop(p, signal.SIGHUP)
    ep.close()
    assert p.returncode == 0, p.lines
    if command == "tail":
        assert out.splitlines() == [b"h%d" % i for i in range(10)]
