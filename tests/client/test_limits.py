"""nsqcli.client.limits against real nsqd: /config read where the HTTP port is known or found
(TCP port + 1, confirmed by /info), bounded when HTTP hangs; the output buffer timeout fitted
into nsqd's range, and every command connecting to an nsqd whose --min-output-buffer-timeout
is above the 50 ms nsqcli asks for."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.helpers import run_nsqcli, wait_for
from tests.support.nsq_fixtures import default_layout_nsqd
from nsqcli import Config, Producer
from nsqcli.client import limits


@pytest.fixture(autouse=True)
def fresh():
    limits.forget()
    yield
    limits.forget()


def test_config_is_read_where_nsqd_answers_http_at_its_tcp_port_plus_one(tmp_path):
    sb = default_layout_nsqd(tmp_path, "--max-msg-size=3000000", "--max-body-size=6000000",
                             "--min-output-buffer-timeout=100ms", "--max-req-timeout=10m", "--max-rdy-count=300")
    try:
        nsqd = sb.nsqd
        got = limits.ask([nsqd.tcp_address])[nsqd.tcp_address]
        assert got.source == "config" and got.http_address == nsqd.http_address, got
        assert (got.max_msg_size, got.max_body_size, got.max_rdy_count) == (3000000, 6000000, 300)
        assert (got.min_output_buffer_timeout, got.max_output_buffer_timeout, got.max_req_timeout) == (0.1, 30.0, 600.0)
        assert got.max_message == 3000000 and got.msg_timeout == 60.0
        # the first connection fits into the range at once: 100 ms granted, not nsqd's 250 ms default
        p = Producer([nsqd.tcp_address], Config())
        try:
            p.publish("t", b"x")
            conn = next(iter(p._links.values()))
            assert conn.features["output_buffer_timeout"] == 100
            assert limits.known(nsqd.tcp_address).version == "1.3.0"  # the IDENTIFY answer, noted
        finally:
            p.close()
    finally:
        sb.stop()


def test_a_refused_output_buffer_timeout_is_learnt_for_the_next_connections(tmp_path):
    """The first connection knows nothing: refused, dialled again with nsqd's default (250 ms);
    the range is learnt in the background, and the next connection asks for its minimum."""
    sb = default_layout_nsqd(tmp_path, "--min-output-buffer-timeout=100ms")
    try:
        address = sb.nsqd.tcp_address
        granted = []
        for _ in range(2):
            p = Producer([address], Config())
            try:
                p.publish("t", b"x")
                granted.append(next(iter(p._links.values())).features["output_buffer_timeout"])
            finally:
                p.close()
            wait_for(lambda: limits.known(address).min_output_buffer_timeout == 0.1, timeout=5, what="/config learnt")
        assert granted == [250, 100]
    finally:
        sb.stop()


def test_an_http_port_not_at_tcp_plus_one_is_not_guessed_and_one_lookupd_told_is_used(nsqd_factory):
    nsqd = nsqd_factory(max_msg_size=2000000)
    got = limits.ask([nsqd.tcp_address], timeout=2.0)[nsqd.tcp_address]
    assert got.source != "config" and got.max_msg_size is None and got.max_message is None
    assert "HTTP address is not known" in got.error
    limits.forget()
    limits.note_http(nsqd.tcp_address, nsqd.http_address)  # what nsqlookupd's http_port says
    assert limits.ask([nsqd.tcp_address])[nsqd.tcp_address].max_msg_size == 2000000


def test_a_hung_http_port_costs_the_timeout_once():
    with socket.socket() as hung:  # accepts (the kernel does), never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        address = f"127.0.0.1:{hung.getsockname()[1] - 1}"
        limits.note_http("127.0.0.1:9", f"127.0.0.1:{hung.getsockname()[1]}")
        t0 = time.monotonic()
        got = limits.ask([address, "127.0.0.1:9"], timeout=0.8)
        took = time.monotonic() - t0
    assert took < 1.8, took
    assert all(lim.max_msg_size is None for lim in got.values())


def test_fitting_the_identify_body():
    lim = limits.Limits("a:1", min_output_buffer_timeout=0.1, max_output_buffer_timeout=1.0)
    assert [lim.fit_output_buffer_timeout(ms) for ms in (50, 100, 250, 5000, 0, -1)] == [100, 100, 250, 1000, 0, -1]
    assert limits.Limits("a:1").fit_output_buffer_timeout(50) == 50  # range unknown: as asked
    assert limits.Limits("a:1", max_msg_size=3000000, max_body_size=2000000).max_message == 2000000 - 8
    body = {"output_buffer_timeout": 50}
    assert limits.fit_identify("b:2", dict(body)) == body  # nothing known: untouched
    limits.refused("b:2", "output_buffer_timeout", learn=False)
    assert limits.fit_identify("b:2", dict(body)) == {"output_buffer_timeout": 0}  # nsqd's own default


def test_every_command_connects_to_an_nsqd_whose_minimum_output_buffer_timeout_is_above_50ms(nsqd_factory, topic):
    """nsqd >= 1.2 refuses IDENTIFY's output_buffer_timeout below --min-output-buffer-timeout
    (E_BAD_BODY, then it closes): every command exited 1 saying so. The HTTP port of this nsqd
    cannot be found, so the connection is dialled again with nsqd's default."""
    nsqd = nsqd_factory(extra_args=["--min-output-buffer-timeout=100ms"])
    dst = nsqd_factory()
    a = ["--nsqd-tcp-address", nsqd.tcp_address]
    r = run_nsqcli(["pub", topic, "one", *a])
    assert r.returncode == 0, r.stderr
    r = run_nsqcli(["mpub", topic, *a, "-q"], input=b"two\nthree\n")
    assert r.returncode == 0, r.stderr
    r = run_nsqcli(["tail", topic, "-n", "3", *a, "--timeout", "10s"])
    assert (r.returncode, r.stdout) == (0, b"one\ntwo\nthree\n"), r.stderr
    r = run_nsqcli(["mpub", topic + "_c", *a, "-q"], input=b"x\ny\n")
    r = run_nsqcli(["to-nsq", "-t", topic + "_c", *a, "--destination-nsqd-tcp-address", dst.tcp_address, "-n", "2",
                    "--timeout", "10s"])
    assert r.returncode == 0 and b"copied 2," in r.stderr, r.stderr
    r = run_nsqcli(["to-nsq", "-t", topic + "_c", "--nsqd-tcp-address", dst.tcp_address,
                    "--destination-nsqd-tcp-address", nsqd.tcp_address, "--destination-topic", topic + "_back",
                    "-n", "2", "--timeout", "10s"])
    assert r.returncode == 0 and b"copied 2," in r.stderr, r.stderr
    assert b"E_BAD_BODY" not in r.stderr


def test_a_requeue_delay_is_capped_at_nsqds_max_req_timeout(tmp_path):
    """nsqd <= 1.1 closes the connection on a REQ above its --max-req-timeout (1.2+ clamps it
    and logs): where /config told it, the consumer asks for no more than that; elsewhere nsqd
    decides. The message asked back in 10 min is redelivered within seconds."""
    from nsqcli.client.responses import req_ms as _req_ms

    from nsqcli import Consumer
    from tests.support.helpers import http_post

    sb = default_layout_nsqd(tmp_path, "--max-req-timeout=1s")
    try:
        nsqd = sb.nsqd
        assert _req_ms(nsqd.tcp_address, 600) == 600_000  # nothing known: nsqd decides
        assert _req_ms(nsqd.tcp_address, float("inf")) == 2**31  # (int(inf) raised)
        assert limits.ask([nsqd.tcp_address])[nsqd.tcp_address].max_req_timeout == 1.0
        assert _req_ms(nsqd.tcp_address, 600) == 1000 and _req_ms(nsqd.tcp_address, 0.5) == 500
        http_post(nsqd.http_address, "/pub", b"again", topic="t")
        seen = []

        def handler(msg):
            seen.append((time.monotonic(), msg.attempts))
            if msg.attempts == 1:
                msg.requeue(delay=600, backoff=False)

        c = Consumer("t", "c", handler, nsqd_tcp_addresses=[nsqd.tcp_address], config=Config())
        c.start()
        try:
            wait_for(lambda: len(seen) == 2, timeout=15, what="the message redelivered")
        finally:
            c.stop()
        # nsqd scans a new channel's deferred queue from its next 5 s refresh on
        assert seen[1][1] == 2 and 0.5 < seen[1][0] - seen[0][0] < 8
    finally:
        sb.stop()
