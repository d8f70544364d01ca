"""tail --peek's pacing (nsqcli/cli/peek.py, through tail's Sink) against a small model of nsqd:
per node a queue, a RDY and what is in flight; a REQ 0 puts the message at the back of its
node's queue. Hypothesis picks the backlogs, -n, --max-in-flight and the order and size of the
deliveries; every run must end without a stall, show what it should, and give every delivery
back exactly once, so every node's queue is what it was."""

from __future__ import annotations

import io
import threading
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqcli.cli.commands.tail import Sink
from nsqcli.cli.peek import Peek


class _Conn:
    def __init__(self, rdy: int):
        self.rdy = rdy


class _Node:
    def __init__(self, address: str, backlog: int, rdy: int):
        self.address = address
        self.queue = deque(b"%s-%d" % (address.encode(), i) for i in range(backlog))
        self.in_flight: set = set()
        self.conn = _Conn(rdy)
        self.deliveries = 0
        self.requeues = 0


class _Msg:
    def __init__(self, node: _Node, id: bytes):
        self.node, self.id, self.body = node, id, id
        self.nsqd, self.topic = node.address, "orders"
        self.responder = node.conn  # what Peek reads the RDY from: responder.rdy
        self.responded = False
        self.auto_response = True

    def requeue(self, delay=None, backoff=True):
        assert delay == 0 and not backoff
        assert not self.responded, "answered twice"
        self.responded = True
        self.node.in_flight.remove(self.id)
        self.node.queue.append(self.id)  # REQ 0: the back of the queue
        self.node.requeues += 1

    def touch(self):
        pass


def _run(backlogs: list[int], count: int, mif: int, steps: list[tuple[int, int]]):
    mif = max(mif, len(backlogs), count if count and count < mif else 0)
    if count and count < mif:
        mif = count  # as tail does
    rdy = max(1, mif // len(backlogs))
    nodes = [_Node(f"127.0.0.1:{4150 + 10 * i}", n, rdy) for i, n in enumerate(backlogs)]
    book = Peek(count, mif)
    book.add_backlog("orders", {n.address: len(n.queue) for n in nodes})
    sink = Sink(lambda m: m.body, b"\n", count, threading.Event(), peek=book)
    sink.out = io.BytesIO()
    steps = deque(steps)
    while not sink.done.is_set():
        ready = [n for n in nodes if n.queue and len(n.in_flight) < n.conn.rdy]
        if not ready:
            break  # nsqd can send nothing more
        pick, size = steps.popleft() if steps else (0, 1 << 30)
        node = ready[pick % len(ready)]
        batch = []
        while node.queue and len(node.in_flight) < node.conn.rdy and len(batch) < size:
            id = node.queue.popleft()
            node.in_flight.add(id)
            node.deliveries += 1
            batch.append(_Msg(node, id))
        sink(batch)
    stalled = not sink.done.is_set()
    sink.give_back()
    return nodes, sink, stalled


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(backlogs=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       count=st.integers(0, 30), mif=st.integers(1, 50),
       steps=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 20)), max_size=60))
def test_peek_never_stalls_and_leaves_every_node_as_it_was(backlogs, count, mif, steps):
    nodes, sink, stalled = _run(backlogs, count, mif, steps)
    total = sum(backlogs)
    shown = sink.out.getvalue().split(b"\n")[:-1]
    want = min(count, total) if count else total
    if total or count:
        assert not stalled or (count and total < count), (backlogs, count, mif, len(shown))
    assert len(shown) == len(set(shown)) == want, (backlogs, count, mif, len(shown))
    for node, n in zip(nodes, backlogs):
        assert not node.in_flight, "a delivery was not given back"
        assert sorted(node.queue) == sorted(b"%s-%d" % (node.address.encode(), i) for i in range(n))
        assert node.requeues == node.deliveries  # each delivery given back exactly once
        assert node.deliveries <= n, "a message came round again: its attempts rose by two"
    assert sink.peek.given_back == sum(n.deliveries for n in nodes)


def test_a_node_whose_rdy_is_all_held_under_n_gives_them_back_and_goes_on():
    """8 and 2 waiting, -n 10 (RDY 5 and 5): the first node's five shown are all its RDY; it gives
    them back so nsqd can send the other three (the stall of a pacing shared over all nodes)."""
    nodes, sink, stalled = _run([8, 2], 10, 10, [(0, 5), (1, 5)])
    assert not stalled and len(sink.out.getvalue().split(b"\n")[:-1]) == 10
    assert nodes[0].deliveries == 8  # each message once: the five given back did not come round again
