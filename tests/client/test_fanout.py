"""nsqcli.client.fanout.ask_all (and http.ask_http on it): every item at once, one deadline for
the round, answers in input order, a stuck item never holds the caller."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from nsqcli.client.fanout import ask_all
from nsqcli.client.http import ask_http, http_json
from nsqcli.errors import LookupdError, Timeout


def test_answers_and_errors_come_back_in_input_order():
    def fn(x):
        time.sleep(0.05 * (5 - x))  # the last item answers first
        if x == 2:
            raise LookupdError("refused", f"node{x}")
        return x * 10

    answers = ask_all(range(5), fn, 2.0, catch=LookupdError)
    assert [a.value for a in answers] == [0, 10, None, 30, 40]
    assert [a.ok for a in answers] == [True, True, False, True, True]
    assert str(answers[2].error) == "node2: refused"
    assert ask_all([], fn, 1.0) == []


def test_a_stuck_item_costs_the_round_one_deadline_and_is_named():
    release = threading.Event()

    def fn(x):
        if x.startswith("hung"):
            release.wait()  # ignores any deadline of its own, as a DNS lookup may
        return x

    items = ["a:1", "hung:2", "b:3", "hung:4", "c:5"]
    t0 = time.monotonic()
    answers = ask_all(items, fn, 0.3, slack=0.1)
    took = time.monotonic() - t0
    release.set()
    assert took < 1.0  # one deadline for the round, not one per stuck item (nor for ever)
    assert [a.value for a in answers] == ["a:1", None, "b:3", None, "c:5"]
    for i in (1, 3):
        assert isinstance(answers[i].error, Timeout) and isinstance(answers[i].error, TimeoutError)
        assert str(answers[i].error) == f"{items[i]}: no answer within 0.3s"


def test_threads_are_capped_and_items_behind_stuck_ones_time_out_unstarted():
    lock = threading.Lock()
    running, peak, started = [0], [0], []
    release = threading.Event()

    def fn(x):
        with lock:
            started.append(x)
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            if x < 2:
                release.wait()
            else:
                time.sleep(0.02)
            return x
        finally:
            with lock:
                running[0] -= 1

    answers = ask_all(range(6), fn, 0.2, threads=2, slack=0.05)
    assert peak[0] <= 2
    assert [a.ok for a in answers] == [False] * 6  # both threads stuck: nobody started the rest
    release.set()
    time.sleep(0.1)
    assert sorted(started) == [0, 1]  # and nothing starts after the round ended
    answers = ask_all(range(40), fn, 2.0, threads=4)
    assert [a.value for a in answers] == list(range(40)) and peak[0] <= 4


def test_an_exception_not_caught_is_raised_after_the_round():
    def fn(x):
        if x == 1:
            raise KeyError("a bug")
        return x

    with pytest.raises(KeyError):
        ask_all([0, 1, 2], fn, 1.0, catch=LookupdError)


def silent_servers(n: int) -> list[socket.socket]:
    """Listening sockets that accept (the kernel does) and never answer: hung HTTP servers."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        socks.append(s)
    return socks


def test_ask_http_many_hung_nodes_cost_one_deadline(nsqd):
    socks = silent_servers(6)
    try:
        hung = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
        nodes = hung[:3] + [nsqd.http_address] + hung[3:]
        t0 = time.monotonic()
        answers = ask_http(nodes, lambda a: http_json(a, "/ping", timeout=0.5), 0.5)
        took = time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
    assert took < 1.5  # sequentially: 6 x 0.5 s
    assert [a.ok for a in answers] == [False] * 3 + [True] + [False] * 3
    assert answers[3].value == "OK"
    for address, a in zip(nodes, answers):
        if not a.ok:
            assert isinstance(a.error, LookupdError) and str(a.error).startswith(f"http://{address}/ping: ")
            assert "no complete answer within 0.5s" in str(a.error) and "\n" not in str(a.error)
