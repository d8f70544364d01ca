"""--timeout bounds the whole command, counted from process start, on the commands that speak
HTTP (issue 33, part 3): stat, lookup, doctor and the topic/channel actions against a hung node
(a real nsqd, SIGSTOPped: it accepts connections and never answers) end at the deadline with
exit 3 (within MARGIN, from outside); against a healthy node they exit 0 long before it."""

from __future__ import annotations

import importlib.util
import time

import pytest

from tests.support.helpers import one_error_line, run_nsqcli
from tests.support.hung import stopped

TIMEOUT = 1.5
#: measured from outside: the interpreter's start-up before nsqcli's clock starts (the deadline
#: counts from there) and the exit, on a busy machine. Under the 5 s a request's own timeout takes.
MARGIN = 2.0
#: doctor's: below its own 3 s HTTP timeout, so that the hung node's HTTP check ends at the deadline
DOCTOR_TIMEOUT = 2.5


@pytest.fixture
def hung(nsqd_factory):
    server = nsqd_factory()
    with stopped(server):
        yield server


def _timed(args, timeout=TIMEOUT):
    t0 = time.monotonic()
    r = run_nsqcli(args + ["--timeout", f"{timeout}s"], timeout=30)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("name, args", [
    ("stat", lambda s: ["stat", "-n", "1", "--nsqd-http-address", s.http_address]),
    ("stat through lookupd", lambda s: ["stat", "-n", "1", "--lookupd-http-address", s.http_address]),
    ("lookup", lambda s: ["lookup", "--lookupd-http-address", s.http_address]),
    ("doctor", lambda s: ["doctor", "--nsqd-tcp-address", s.tcp_address, "--nsqd-http-address", s.http_address]),
    ("topic pause", lambda s: ["topic", "pause", "t", "--nsqd-http-address", s.http_address]),
    ("channel empty through lookupd", lambda s: ["channel", "empty", "t", "c", "--yes",
                                                  "--lookupd-http-address", s.http_address]),
])
def test_a_hung_node_costs_the_timeout_then_exit_3(hung, name, args):
    r, took = _timed(args(hung))
    one_error_line(r, 3, r"--timeout passed")
    assert took < TIMEOUT + MARGIN, (name, took)


def test_the_deadline_counts_from_process_start_and_cuts_every_stage(hung, nsqd):
    """A healthy nsqd beside the hung one: doctor still ends at the deadline, and says which
    checks were not done and which were. A doctor that ignored the deadline (the hung TCP check:
    dial 1 s + handshake 5 s) or checked the hung node's TCP and HTTP one after the other (5 s)
    ends past the bound."""
    r, took = _timed(["doctor", "--nsqd-tcp-address", hung.tcp_address, "--nsqd-tcp-address", nsqd.tcp_address,
                      "--nsqd-http-address", hung.http_address, "--nsqd-http-address", nsqd.http_address], DOCTOR_TIMEOUT)
    checks = 4 + (1 if importlib.util.find_spec("pyspark") else 0)  # doctor's last line: the installed pyspark
    one_error_line(r, 3, rf"--timeout passed before every check was done \(2 of {checks} checks failed\)")
    out = r.stdout.decode()
    assert f"ok   nsqd {nsqd.tcp_address} (TCP)" in out and f"FAIL nsqd {hung.tcp_address} (TCP)" in out, out
    assert "give a longer --timeout" in out, out
    assert took < DOCTOR_TIMEOUT + MARGIN, took


def test_a_healthy_cluster_is_not_held_until_the_timeout(nsqd, lookupd):
    for args in (["lookup", "--lookupd-http-address", lookupd.http_address],
                 ["doctor", "--nsqd-tcp-address", nsqd.tcp_address, "--nsqd-http-address", nsqd.http_address],
                 ["topic", "create", "deadline_ok", "--nsqd-http-address", nsqd.http_address]):
        t0 = time.monotonic()
        r = run_nsqcli(args + ["--timeout", "20s"], timeout=30)
        assert r.returncode == 0, (args, r.stderr)
        assert time.monotonic() - t0 < 10, args
