"""`nsqcli tail` against real nsqd/nsqlookupd."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from tests.support.helpers import (
    NSQCLI,
    channel_stats,
    clean_env,
    http_get_json,
    http_post,
    one_error_line,
    run_nsqcli,
    shell,
    topic_stats,
    wait_for,
)
from tests.support.inprocess import run_in_process
from tests.support.helpers import run_nsqcli as run
from tests.support.hung import cluster, stopped  # noqa: F401 - cluster: the fixture
from tests.support.nsq_fixtures import default_layout_nsqd
from tests.support.portforward import PortPair

from nsqcli import Producer


@pytest.fixture
def env(sandbox):
    return {"NSQCLI_NSQD_TCP_ADDRESS": sandbox.nsqd.tcp_address}




def read_terminal(master: int) -> bytes:
    """Everything the program wrote to the pty (its side is closed: read until EIO/EOF)."""
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk


def test_tail_json_roundtrip_through_mpub(nsqd, env, topic):
    bodies = [b"plain", b"multi\nline", b"\xff\xfe binary \x00", "ünïcode".encode()]
    body = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    http_post(nsqd.http_address, "/mpub", len(bodies).to_bytes(4, "big") + body, topic=topic, binary="true")
    r = run(["tail", "-t", topic, "-n", "4", "--format", "json", "-c", "c"], env)
    assert r.returncode == 0
    r2 = run(["mpub", "-t", topic + "_copy", "--format", "json"], env, input=r.stdout)
    assert r2.returncode == 0, r2.stderr
    r3 = run(["tail", "-t", topic + "_copy", "-n", "4", "--format", "json", "-c", "c"], env)
    import base64
    copies = [json.loads(line) for line in r3.stdout.splitlines()]
    assert [base64.b64decode(d["body_base64"]) if "body_base64" in d else d["body"].encode()
            for d in copies] == bodies


def test_tail_count_across_topics_fins_everything_shown(nsqd, env, topic):
    t2 = topic + "_b"
    for t in (topic, t2):
        http_post(nsqd.http_address, "/mpub", b"\n".join(b"%s-%d" % (t.encode(), i) for i in range(5)), topic=t)
    r = run(["tail", "-t", topic, "-t", t2, "-n", "7", "-c", "durable"], env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 7
    # every shown message FINed, the rest requeued: nothing in flight, 3 left
    def settled():
        a, b = channel_stats(nsqd, topic, "durable"), channel_stats(nsqd, t2, "durable")
        return (a["in_flight_count"] + b["in_flight_count"] == 0) and a["depth"] + b["depth"] == 3
    wait_for(settled, what="7 FINed, 3 back in the queue")


def test_tail_format_template_and_print_topic(nsqd, env, topic):
    http_post(nsqd.http_address, "/pub", b"body1", topic=topic)
    r = run(["tail", "-t", topic, "-n", "1", "-c", "c", "--format", "{topic} {attempts} {body}"], env)
    assert r.stdout == f"{topic} 1 body1\n".encode()
    http_post(nsqd.http_address, "/pub", b"body2", topic=topic)
    r = run(["tail", "-t", topic, "-n", "1", "-c", "c", "--print-topic"], env)
    assert r.stdout == f"{topic} | body2\n".encode()
    r = run_in_process(["tail", "-t", topic, "-n", "1", "--format", "{nope}"], env)
    assert r.returncode == 2 and b"unknown field" in r.stderr


def test_tail_timeout_exit_3_and_idle_timeout(nsqd, env, topic):
    http_post(nsqd.http_address, "/pub", b"only", topic=topic)
    # 3 s: on a loaded machine (three test passes at once) 1 s passed before tail had connected
    r = run(["tail", "-t", topic, "-n", "2", "--timeout", "3s", "-c", "c"], env)
    assert r.returncode == 3 and r.stdout == b"only\n" and b"after 1 of 2 messages" in r.stderr
    t0 = time.monotonic()
    r = run(["tail", "-t", topic, "--idle-timeout", "0.5s"], env)
    assert r.returncode == 0 and time.monotonic() - t0 < 10


def test_tail_default_channel_is_ephemeral(nsqd, env, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    p = subprocess.Popen(NSQCLI + ["tail", "-t", topic], env={**os.environ, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        chans = wait_for(lambda: topic_stats(nsqd, topic)["channels"], what="channel created")
        assert chans[0]["channel_name"].startswith("nsqcli_tail") and chans[0]["channel_name"].endswith("#ephemeral")
        http_post(nsqd.http_address, "/pub", b"live!", topic=topic)
        # message_count counts what reached the channel, not the client: wait for tail's FIN
        wait_for(lambda: (lambda ch: ch["message_count"] == 1 and ch["depth"] == 0 and ch["in_flight_count"] == 0)(
            topic_stats(nsqd, topic)["channels"][0]), what="delivered and FINed")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and out == b"live!\n", err


def test_tail_closed_pipe_exits_quietly(nsqd, env, topic):
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"line%d" % i for i in range(2000)), topic=topic)
    r = shell("set -o pipefail; " + " ".join(NSQCLI) + f" -q tail -t {topic} -c c | head -n 3", 30,
              env={**os.environ, **env})
    assert r.stdout == b"line0\nline1\nline2\n" and r.stderr == b"" and r.returncode == 0
    wait_for(lambda: channel_stats(nsqd, topic, "c")["in_flight_count"] == 0, what="nothing left in flight")


def test_tail_ends_when_its_reader_goes_with_everything_already_written(nsqd, env, topic):
    """`tail | (sleep 1; head -n 3)`: every message is in the pipe before head reads, so no
    write ever fails with EPIPE; tail still ends (its stdout's reader gone, as GNU tail -f sees
    it) instead of waiting for a next message for ever (CI: a 30 s hang when head came late)."""
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"line%d" % i for i in range(5)), topic=topic)
    r = shell("set -o pipefail; " + " ".join(NSQCLI) + f" -q tail -t {topic} -c c | (sleep 1; head -n 3)", 20,
              env={**os.environ, **env})
    assert r.stdout == b"line0\nline1\nline2\n" and r.stderr == b"" and r.returncode == 0


def test_a_socket_stdout_that_fails_is_an_error_not_a_reader_gone(nsqd, env, topic):
    """Only a pipe is watched for its reader gone (review: a socket's POLLERR is a real error):
    stdout a UDP socket to a port nobody listens on - the first write's ICMP refusal fails the
    second write, which is said (exit 1), never taken for `| head` going (a silent 0)."""
    import socket

    from nsqcli.sandbox import free_port

    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.connect(("127.0.0.1", free_port()))
    p = subprocess.Popen(NSQCLI + ["-q", "tail", "-t", topic, "-c", "c"], stdout=out.fileno(), stderr=subprocess.PIPE,
                         env={**os.environ, **env})
    out.close()
    try:
        http_post(nsqd.http_address, "/pub", b"first", topic=topic)
        wait_for(lambda: (channel_stats(nsqd, topic, "c") or {}).get("message_count") == 1
                 and channel_stats(nsqd, topic, "c")["in_flight_count"] == 0, what="the first written and FINed")
        time.sleep(0.5)  # the refusal has come back; tail has looked at its stdout a few times
        assert p.poll() is None, p.stderr.read()
        http_post(nsqd.http_address, "/pub", b"second", topic=topic)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 1 and b"cannot write to stdout: Connection refused" in err, err


def test_tail_connection_refused(topic):
    r = run(["tail", "-t", topic, "--nsqd-tcp-address", "127.0.0.1:1", "-n", "1"])
    assert r.returncode == 1 and r.stderr == b"nsqcli: error: 127.0.0.1:1: cannot connect: Connection refused\n"


def test_tail_json_all_byte_values(nsqd, env, topic):
    bodies = [bytes([i]) for i in range(256)] + [bytes(range(256)), b" ", b"\n", b"\r\n", b"\x00\x00"]
    payload = len(bodies).to_bytes(4, "big") + b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    http_post(nsqd.http_address, "/mpub", payload, topic=topic, binary="true")
    r = run(["tail", "-t", topic, "-n", str(len(bodies)), "--format", "json", "-c", "c"], env)
    r2 = run(["mpub", "-t", topic + "_copy", "--format", "json"], env, input=r.stdout)
    assert r2.returncode == 0 and f"published {len(bodies)},".encode() in r2.stderr
    r3 = run(["tail", "-t", topic + "_copy", "-n", str(len(bodies)), "--format", "json", "-c", "c"], env)
    import base64
    got = [base64.b64decode(d["body_base64"]) if "body_base64" in d else d["body"].encode()
           for d in map(json.loads, r3.stdout.splitlines())]
    assert sorted(got) == sorted(bodies)


# -- strict flags and no silent waits ----------------------------------------------------------------
def test_tail_refuses_to_drop_a_backlog_into_an_ephemeral_channel(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(50)), topic=topic)
    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address}
    one_error_line(run_nsqcli(["tail", topic, "-n", "1"], env), 1,
                   rf"topic '{topic}' on nsqd {nsqd.http_address} has 50 messages and no channel yet: .* "
                   r"--channel NAME, or take it anyway with --drain-backlog")
    t = topic_stats(nsqd, topic)
    assert t["depth"] == 50 and t["channels"] == []  # nothing was taken
    r = run_nsqcli(["tail", topic, "-c", "keep", "-n", "2"], env)
    assert r.returncode == 0 and r.stdout == b"m0\nm1\n"
    assert topic_stats(nsqd, topic)["channels"][0]["depth"] == 48
    # the topic has a channel now: an ephemeral tail takes nothing from it
    http_post(nsqd.http_address, "/pub", b"new", topic=topic)
    r = run_nsqcli(["tail", topic, "-n", "1", "--timeout", "5s"], env)
    assert r.returncode == 3 and r.stdout == b""  # a new ephemeral channel sees only new messages


def test_tail_backlog_check_asks_every_node_at_once(cluster, topic):
    """Two of three nsqd hang (SIGSTOP), listed first; the third has a backlog: the /stats
    pre-check asks all three at once and refuses after one deadline (3 s), not one per hung node."""
    healthy, *hung = cluster.nsqds
    http_post(healthy.http_address, "/mpub", b"1\n2\n3", topic=topic)
    order = [*hung, healthy]
    env = {"NSQCLI_NSQD_TCP_ADDRESS": " ".join(n.tcp_address for n in order),
           "NSQCLI_NSQD_HTTP_ADDRESS": " ".join(n.http_address for n in order)}
    with stopped(*hung):
        t0 = time.monotonic()
        r = run_nsqcli(["tail", topic, "-n", "1"], env, timeout=60)
        took = time.monotonic() - t0
    one_error_line(r, 1, rf"topic '{topic}' on nsqd {healthy.http_address} has 3 messages and no channel yet")
    assert took < 5.5, took  # one node after another: 2 x 3 s
    assert topic_stats(healthy, topic)["channels"] == []  # nothing was taken


SLOW_START = """
import time
import nsqcli.client.consumer as c
_start = c.Consumer.start
def start(self, *a, **kw):
    out = _start(self, *a, **kw)
    time.sleep(1.0)  # the main thread descheduled here on a busy machine: the handlers already run
    return out
c.Consumer.start = start
"""


def test_tail_n_done_before_its_consumer_s_start_returned_takes_no_more(nsqd, topic, tmp_path):
    """The consumer's handlers run before its start() returns to tail, which then put it on its
    list. On a busy machine -n was done in between: _stop had no consumer to stop, its RDY stayed
    up, and every message given back came straight back - 201 and 348 REQs seen for -n 2 (each an
    attempt that --max-attempts counts elsewhere). -n done now means RDY 0 on every consumer
    made, started or not. The slow return is played by a sitecustomize in the real executable."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="work")
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(20)), topic=topic)
    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "PYTHONPATH": str(tmp_path)}
    r = run(["tail", topic, "-c", "work", "-n", "2", "--max-in-flight", "4", "--timeout", "20s"], env, timeout=60)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    wait_for(lambda: channel_stats(nsqd, topic, "work")["in_flight_count"] == 0, what="nothing in flight")
    ch = channel_stats(nsqd, topic, "work")
    assert ch["depth"] == 18 and ch["requeue_count"] <= 4, ch  # each one on its way given back once


def test_tail_says_when_the_backlog_check_could_not_be_made(nsqd, topic):
    """A direct nsqd whose HTTP port is not TCP + 1 and no --nsqd-http-address: said, not silent."""
    r = run_nsqcli(["tail", topic, "-n", "1", "--timeout", "2s", "--nsqd-tcp-address", nsqd.tcp_address])
    host, port = nsqd.tcp_address.rsplit(":", 1)
    assert r.returncode == 3 and r.stderr.decode().startswith(
        f"nsqcli: warning: could not check topic '{topic}' for a backlog without channels "
        f"(nsqd {nsqd.tcp_address}: its HTTP address is not known ({host}:{int(port) + 1}, TCP port + 1, "
        f"did not answer /info as the nsqd of TCP port {port}))")
    assert "(give --nsqd-http-address to check)" in r.stderr.decode()


def test_tail_does_not_take_another_nsqds_stats_at_tcp_port_plus_one(nsqd, nsqd_factory, topic):
    """nsqd X reached through a port forward P -> X's TCP, and P + 1 forwards to another nsqd Y's
    HTTP: Y's /stats (no such topic) is not X's. Its /info names another TCP port, so X's
    backlog cannot be checked and tail says so (before: no word, and the ephemeral channel
    took X's backlog and dropped what it did not show)."""
    other = nsqd_factory()
    http_post(nsqd.http_address, "/mpub", b"r0\nr1\nr2", topic=topic)
    with PortPair(nsqd.tcp_address, other.http_address) as fwd:
        r = run_nsqcli(["tail", "-t", topic, "--nsqd-tcp-address", fwd.address, "-n", "1"], timeout=30)
    err = r.stderr.decode()
    assert r.returncode == 0 and r.stdout == b"r0\n", err
    assert err == (f"nsqcli: warning: could not check topic '{topic}' for a backlog without channels "
                   f"(nsqd {fwd.address}: its HTTP address is not known (127.0.0.1:{fwd.port + 1}, TCP port + 1, "
                   f"did not answer /info as the nsqd of TCP port {fwd.port})); if it had one, this ephemeral "
                   "channel took it and keeps only nsqd's --mem-queue-size of it (give --nsqd-http-address to "
                   "check)\n")
    assert topic_stats(other, topic) is None  # Y never had the topic


def test_tail_checks_a_default_layout_nsqd_from_its_tcp_address(tmp_path, topic):
    """nsqd on TCP P and HTTP P + 1 (as 4150/4151): /info confirms P + 1, the backlog is found
    and refused; also when the TCP address is given by name."""
    sb = default_layout_nsqd(tmp_path)
    try:
        x = sb.nsqd
        http_post(x.http_address, "/mpub", b"1\n2\n3", topic=topic)
        port = int(x.tcp_address.rsplit(":", 1)[1])
        for tcp, http in ((x.tcp_address, x.http_address), (f"localhost:{port}", f"localhost:{port + 1}")):
            one_error_line(run_nsqcli(["tail", "-t", topic, "--nsqd-tcp-address", tcp, "-n", "1"]), 1,
                           rf"topic '{topic}' on nsqd {http} has 3 messages and no channel yet")
        t = topic_stats(x, topic)
        assert t["depth"] == 3 and t["channels"] == []  # nothing was taken
    finally:
        sb.stop()


def test_tail_with_drain_backlog_takes_it(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"a\nb", topic=topic)
    r = run_nsqcli(["tail", topic, "-n", "2", "--drain-backlog"], {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address})
    assert r.returncode == 0 and r.stdout == b"a\nb\n"


def test_tail_says_what_it_waits_for(lookupd, nsqd, topic):
    r = run_nsqcli(["tail", topic, "-n", "1", "--timeout", "4s", "--lookupd-http-address", lookupd.http_address])
    err = r.stderr.decode().splitlines()
    assert r.returncode == 3
    assert err[0] == (f"nsqcli: waiting for topic '{topic}': no nsqd carries it yet according to nsqlookupd "
                      f"{lookupd.http_address} (asked every 5 s; it is read as soon as it is published)")
    one_error_line(run_nsqcli(["tail", topic, "--lookupd-http-address", nsqd.http_address]), 1,
                   rf"http://{re.escape(nsqd.http_address)}: answered HTTP 404 to /lookup: not an nsqlookupd "
                   r"HTTP address \(an nsqd HTTP port, or the wrong port\?\)")


def test_tail_finds_a_topic_published_after_it_started(lookupd, nsqd, topic):
    proc = subprocess.Popen(NSQCLI + ["tail", topic, "-n", "1", "--timeout", "20s", "--lookupd-http-address",
                                      lookupd.http_address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env())
    said = proc.stderr.readline()  # it asked nsqlookupd, which knows no nsqd with the topic yet
    assert said.startswith(b"nsqcli: waiting for topic"), said
    http_post(nsqd.http_address, "/pub", b"late", topic=topic)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == b"late\n", err


def test_tail_live_refuses_to_draw_over_its_own_output(nsqd, topic):
    """stdout and stderr on the same terminal: the table would tear the messages - refused
    before connecting; with stdout redirected the table draws on the terminal (stderr)."""
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(NSQCLI + ["tail", topic, "--live", "--nsqd-tcp-address", nsqd.tcp_address],
                             stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=clean_env())
        assert p.wait(timeout=30) == 2
        os.close(slave)
        out = read_terminal(master)
    finally:
        os.close(master)
    assert out.decode().strip() == ("nsqcli: error: --live draws on the terminal that also gets the messages: "
                                    "redirect stdout (nsqcli tail TOPIC --live > FILE) or leave out --live "
                                    "(see 'nsqcli tail --help')")
    assert topic_stats(nsqd, topic) is None  # nothing was subscribed


def test_tail_live_draws_the_table_on_the_terminal(nsqd, topic, tmp_path):
    import pty

    http_post(nsqd.http_address, "/mpub", b"a\nb\nc", topic=topic)
    master, slave = pty.openpty()
    out_file = tmp_path / "bodies"
    try:
        with open(out_file, "wb") as out:
            p = subprocess.Popen(NSQCLI + ["tail", topic, "--live", "--drain-backlog", "-n", "3", "--nsqd-tcp-address",
                                           nsqd.tcp_address], stdin=subprocess.DEVNULL, stdout=out, stderr=slave,
                                 env=clean_env({"COLUMNS": "80", "LINES": "24"}))
            assert p.wait(timeout=30) == 0
        os.close(slave)
        screen = read_terminal(master)
    finally:
        os.close(master)
    assert out_file.read_bytes() == b"a\nb\nc\n"
    text = screen.decode(errors="replace")
    assert "nsqcli connections" in text and "RDY" in text and nsqd.tcp_address.rsplit(":", 1)[1] in text


def test_tail_warns_only_when_a_durable_channel_has_other_consumers(nsqd, topic):
    from nsqcli.client.config import Config
    from nsqcli.client.consumer import Consumer

    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address}
    http_post(nsqd.http_address, "/pub", b"one", topic=topic)
    r = run_nsqcli(["tail", topic, "-c", "mine", "-n", "1"], env)
    assert r.returncode == 0 and r.stdout == b"one\n" and r.stderr == b""
    other = Consumer(topic, "shared", handler=lambda m: None, config=Config(),
                     nsqd_tcp_addresses=[nsqd.tcp_address]).start()
    try:
        wait_for(lambda: http_get_json(nsqd.http_address, "/stats", format="json", topic=topic)["topics"][0]
                 ["channels"][-1]["client_count"] == 1, what="the other consumer")
        # the check's budget is what is left of --timeout, at most 3 s: 5 s leaves it the 3 s after
        # a busy machine's start-up (1 s left it none at times)
        r = run_nsqcli(["tail", topic, "-c", "shared", "--timeout", "5s"], env)
    finally:
        other.stop()
    assert r.stderr.decode().splitlines()[0] == (
        f"nsqcli: warning: channel {topic}/shared has 1 other consumer(s): the messages tail shows are FINed here "
        "and never reach them (leave out --channel for a copy of every message)")


def test_lookupd_poll_interval_option():
    r = run(["tail", "--help"])
    assert b"--lookupd-poll-interval" in r.stdout and b"NSQCLI_LOOKUPD_POLL_INTERVAL" in r.stdout
    r = run_in_process(["tail", "-t", "t", "--lookupd-poll-interval", "soon"])
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"is not a duration" in r.stderr


def test_tail_to_a_full_disk_exits_1_with_one_line(nsqd, topic):
    with Producer(nsqd.tcp_address) as p:
        p.multi_publish(topic, [b"x" * 100] * 50)
    with open("/dev/full", "wb") as full:
        r = subprocess.run(NSQCLI + ["tail", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "-c", "c",
                                     "-n", "50", "--timeout", "10s"], stdout=full, stderr=subprocess.PIPE,
                           timeout=30)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.decode().splitlines()
    assert lines[-1].startswith("nsqcli: error: ") and "No space left" in lines[-1]
    assert "Exception ignored" not in r.stderr.decode() and "Traceback" not in r.stderr.decode()
    # nothing was lost: what could not be written was requeued
    wait_for(lambda: channel_stats(nsqd, topic, "c")["depth"] + channel_stats(nsqd, topic, "c")["in_flight_count"] == 50,
             what="all 50 messages still in the channel")


def test_tail_prints_a_healthy_nodes_messages_while_hung_ones_time_out(cluster, topic):
    """Two of three nsqd hang (SIGSTOP; the kernel still accepts their connections), listed
    first; the third holds the messages. Handshakes run side by side, each under its own
    deadline: the messages are printed once the healthy node answers, not after a 5 s
    handshake deadline per hung node (18 s before)."""
    healthy, *hung = cluster.nsqds
    http_post(healthy.http_address, "/mpub", b"1\n2\n3", topic=topic)
    order = [*hung, healthy]
    env = {"NSQCLI_NSQD_TCP_ADDRESS": " ".join(n.tcp_address for n in order)}
    with stopped(*hung):
        t0 = time.monotonic()
        r = run_nsqcli(["tail", topic, "-n", "3", "--drain-backlog"], env, timeout=60)
        took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [b"1", b"2", b"3"]
    assert took < 4, took  # a hung node's handshake deadline is 5 s


@pytest.mark.parametrize("topics", [1, 2])
def test_tail_timeout_is_the_whole_commands_deadline_with_a_hung_lookupd(cluster, topic, topics):
    """--timeout counts from process start: the backlog pre-checks and lookups against a hung
    nsqlookupd spend the same budget (8.4 s for one topic and 11.4 s for two at --timeout 5s
    before)."""
    names = [f"{topic}{i}" for i in range(topics)]
    with stopped(cluster.lookupd):
        t0 = time.monotonic()
        r = run_nsqcli(["tail", *names, "-n", "1", "--timeout", "3s",
                        "--lookupd-http-address", cluster.lookupd.http_address], timeout=60)
        took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr.decode()
    assert 2.9 < took < 3.6, took


# -- refusals: bad input, footguns, grammar (one line, the documented exit code, nothing consumed) -----
from tests.support.refusals import DEAD, address_footgun, argv_footgun, bad_input, grammar_row, ids  # noqa: E402

BAD_INPUT = [
    (["tail"], 2, r"missing TOPIC \(nsqcli tail TOPIC\.\.\., or -t TOPIC\)"),
    (["tail", "t", "-f", "xml"], 2, r"unknown --format 'xml': use raw, json or a template with \{fields\}"),
    (["tail", "t", "-f", "JSON"], 2, r"unknown --format 'JSON': use raw, json \(lower case\)"),
    (["tail", "t", "-f", "{nope}"], 2, r"invalid --format template '\{nope\}': unknown field 'nope'"),
    (["tail", "t", "-f", "{"], 2, r"invalid --format template '\{'"),
    (["tail", "t", "--timeout", "0"], 2, r"'--timeout': must be more than 0 \(leave it out for no deadline\)"),
    (["tail", "t", "--idle-timeout", "0"], 2, r"'--idle-timeout': must be more than 0"),
    (["tail", "t", "-n", "-1"], 2, r"'-n' / '--count': -1 is not in the range x>=0"),
    (["tail", "t", "--max-in-flight", "0"], 2, r"'--max-in-flight': 0 is not in the range 1<=x<=100000"),
    (["tail", "t", "-c", "bad channel"], 2, r"invalid channel name 'bad channel'"),
    (["tail", "t", "--print-topic", "-f", "json"], 2, r"--print-topic goes with --format raw"),
    (["tail", "t", "--sample-rate", "100"], 2, r"'--sample-rate': 100 is not in the range 0<=x<=99"),
    (["tail", "t", "--lookupd-http-address", "127.0.0.1"], 2, r"invalid address '127\.0\.0\.1': expected HOST:PORT"),
    (["tail", "t", "--nsqd-tcp-address", DEAD, "--drain-backlog"], 1, r"127\.0\.0\.1:1: cannot connect"),
    (["tail", "t", "--lookupd-http-address", DEAD], 1, r"http://127\.0\.0\.1:1/lookup.*unreachable"),
    (["tail", "t", "--lookupd-poll-interval", "x"], 2, r"'--lookupd-poll-interval': 'x' is not a duration"),
    (["tail", "t", "--nsqd-http-address", "x"], 2, r"'--nsqd-http-address': invalid address 'x'"),
    (["tail", "bad topic"], 2, r"invalid topic name 'bad topic'"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["tail"], 2, r"missing TOPIC \(nsqcli tail TOPIC\.\.\., or -t TOPIC\)"),
    (["tail", "t", "--timeout", "5s", "--lookupd-http-address", DEAD], 1, r"127\.0\.0\.1:1"),  # said once
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)


ARGV_FOOTGUNS = [
    (["tail", "-topic", "{t}", "--nsqd-tcp-address", "{tcp}", "-n", "1", "--timeout", "2s"],
     r"'-topic' is not an option: use --topic \(two dashes"),
    (["tail", "{t}", "-c", "a", "--channel", "b", "--nsqd-tcp-address", "{tcp}", "-n", "1"],
     r"--channel given twice \(-c 'a', then --channel 'b'\)"),
]


@pytest.mark.parametrize("args,pattern", ARGV_FOOTGUNS, ids=ids(ARGV_FOOTGUNS, width=50))
def test_argv_footgun_is_refused_before_acting(nsqd, topic, args, pattern):
    argv_footgun(nsqd, topic, args, pattern)


ADDRESS_FOOTGUNS = [
    ({}, ["tail", "{t}", "--nsqd-tcp-address", "tcp://{tcp}/", "-n", "1"], r"drop the scheme: {tcp}"),
]


@pytest.mark.parametrize("env,args,pattern", ADDRESS_FOOTGUNS, ids=ids(ADDRESS_FOOTGUNS, at=1, width=50))
def test_address_footgun_is_refused_naming_the_fix(nsqd, topic, env, args, pattern):
    address_footgun(nsqd, topic, env, args, pattern)


def test_where_regex_escapes_a_python_user_types(nsqd, topic):
    # '.name =~ "^\d+$"' (as in Python or grep) was refused with only "bad escape in string": the
    # error now says how to write it, and the doubled escape matches with RE2
    from tests.support.helpers import one_error_line

    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address}
    r = run(["tail", topic, "--where", r'.n =~ "^\d+$"'], env)
    one_error_line(r, 2, r"bad escape in string .*a regular expression's \\d is written \\\\d")
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="billing")
    http_post(nsqd.http_address, "/mpub", b'{"n": "12a"}\n{"n": "123"}\n{"n": "\\u03b1\\u03b2"}\n{"n": "AbC"}',
              topic=topic)
    for where, want in ((r'.n =~ "^\\d+$"', b'{"n": "123"}'), (r'.n =~ "^\\p{Greek}+$"', b'{"n": "\\u03b1\\u03b2"}'),
                        ('.n =~ "(?i)^abc$"', b'{"n": "AbC"}')):
        r = run(["tail", topic, "-c", "billing", "--peek", "--where", where, "-n", "4", "--timeout", "10s"], env)
        assert r.returncode == 0 and r.stdout == want + b"\n", (where, r.stdout, r.stderr)
