"""The publish ledger, tested for its state space rather than the paths we thought of:

- a stateful property test of :class:`nsqcli.client.ledger.Ledger` against a list model;
- a property test of the whole publish path (Producer.publish_iter over real Connection I/O
  threads) against a scripted server (tests/support/scripted.py) that answers OK, E_BAD_BODY,
  E_BAD_MESSAGE, E_MPUB_FAILED, closes before or after publishing, stalls and trickles - the
  count it reports must be exactly the prefix the server holds;
- a replaced connection fails its own publishes at once.

Fixed example budgets, derandomized: the same examples on every CI run.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from tests.support.scripted import ScriptedNsqd

from nsqcli import Config
from nsqcli.client.ledger import Ledger, fit
from nsqcli.client.producer import Producer
from nsqcli.errors import PublishError, Timeout, TransportError
from nsqcli.protocol import encode_mpub
from nsqcli.protocol.commands import mpub_size

BUDGET = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the ledger alone -----------------------------------------------------------------------------
class LedgerMachine(RuleBasedStateMachine):
    """Model: the list of every message taken, and how many are acknowledged (a prefix)."""

    def __init__(self):
        super().__init__()
        self.ledger = Ledger()
        self.taken: list[bytes] = []
        self.acked = 0
        self.n = 0

    @rule(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=8), measured=st.booleans())
    def take(self, sizes, measured):
        bodies = [b"%03d" % (self.n + i) + b"x" * s for i, s in enumerate(sizes)]
        self.n += len(bodies)
        # the producer's batching hands over the lengths it measured; framing uses them
        self.ledger.take(bodies, len(bodies), mpub_size(bodies), "t", list(map(len, bodies)) if measured else None)
        self.taken += bodies

    @precondition(lambda self: len(self.ledger))
    @rule()
    def send_all(self):
        for e in self.ledger.entries:
            e.future = object()

    @precondition(lambda self: len(self.ledger))
    @rule()
    def ack_head(self):
        e = self.ledger.ack_head()
        self.acked += e.count

    @precondition(lambda self: len(self.ledger) and self.ledger.head().count > 1)
    @rule(limit=st.one_of(st.none(), st.integers(8, 200)))
    def split_head(self, limit):
        before = self.ledger.head().count
        self.ledger.split_head(limit)
        assert self.ledger.head().count < before

    @rule()
    def unsend_all(self):
        for e in self.ledger.unsend_all():
            assert e.future is None

    @rule(limit=st.integers(8, 200))
    def refit(self, limit):
        self.ledger.refit(limit)
        for e in self.ledger.entries:
            assert e.future is not None or e.count == 1 or e.nbytes <= limit

    @invariant()
    def counts_add_up(self):
        ledger = self.ledger
        assert ledger.acked == self.acked
        assert ledger.taken == len(self.taken)
        assert ledger.outstanding == sum(e.count for e in ledger.entries)

    @invariant()
    def entries_are_the_unacknowledged_messages_in_order(self):
        pos = self.acked
        for e in self.ledger.entries:
            assert e.start == pos
            assert e.bodies() == self.taken[pos:pos + e.count]
            assert e.nbytes == mpub_size(e.bodies())
            assert e.command() == encode_mpub("t", e.bodies())  # framed without a second check, same bytes
            pos += e.count
        assert pos == len(self.taken)


TestLedger = LedgerMachine.TestCase
TestLedger.settings = settings(max_examples=150, stateful_step_count=30, deadline=None, derandomize=True,
                               database=None)


def test_fit_respects_the_limit_and_keeps_order():
    bodies = [b"a" * 10, b"b" * 50, b"c" * 10, b"d" * 10]
    groups = fit(bodies, 40)
    assert [b for g in groups for b in g] == bodies
    assert all(mpub_size(g) <= 40 or len(g) == 1 for g in groups)


# -- the whole publish path against a scripted server --------------------------------------------
ACTIONS = st.sampled_from(["ok", "ok", "ok", "fail", "drop_before", "drop_after", "trickle", "stall"])


def _first_occurrences(held: list[bytes]) -> list[bytes]:
    return list(dict.fromkeys(held))


@BUDGET
@given(data=st.data())
def test_publish_iter_reports_exactly_what_the_server_holds(data):
    n = data.draw(st.integers(1, 50), label="messages")
    sizes = data.draw(st.lists(st.integers(1, 40), min_size=n, max_size=n), label="sizes")
    bodies = [b"%04d" % i + b"x" * s for i, s in enumerate(sizes)]
    plan = data.draw(st.lists(ACTIONS, max_size=10), label="plan")
    server = ScriptedNsqd(plan, max_body_size=data.draw(st.integers(60, 1500), label="max_body_size"),
                          max_msg_size=data.draw(st.sampled_from([1 << 20, 40]), label="max_msg_size"))
    batch_size = data.draw(st.integers(1, 20), label="batch_size")
    window = data.draw(st.integers(1, 6), label="window")
    # the source yields bare bodies and lists of bodies (mpub yields a list per chunk read)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=8), label="list cuts"))
    source, at = [], 0
    for cut in cuts + [n]:
        if data.draw(st.booleans(), label="as a list"):
            source.append(bodies[at:cut])
        else:
            source += bodies[at:cut]
        at = max(at, cut)
    p = Producer(["s:1", "s:2"], Config(), dial=server.dial)
    error = None
    try:
        result = p.publish_iter("t", source, batch_size=batch_size, window=window, timeout=0.3,
                                retries=30, retry_backoff=0)
        published = result.published
    except PublishError as e:
        error, published = e, e.published
    finally:
        p.close(1.0)
        server.close()

    held = _first_occurrences(server.held)
    unanswered = set(server.published_without_answer)
    # the reported count is the exact acknowledged prefix: all of it held, nothing else
    # held except what the server published without ever answering
    assert held[:published] == bodies[:published]
    assert set(held[published:]) <= unanswered
    duplicated = {b for b in server.held if server.held.count(b) > 1}
    assert duplicated <= unanswered  # only an unanswered publish may be sent twice
    # what the server may hold past the count is said: the messages after it that it may hold
    # (the resume hint's "up to M more"), and how many were sent again (possible duplicates)
    resent = error.resent if error is not None else result.resent
    assert len(server.held) - len(held) <= resent
    if error is not None:
        assert set(held[published:]) <= set(bodies[published:published + error.unanswered]), error.unanswered
        if server.published_without_answer and set(server.published_without_answer) - set(bodies[:published]):
            assert error.unanswered > 0
    too_big = next((i for i, b in enumerate(bodies) if len(b) > server.max_msg_size), None)
    if "stall" in server.actions:
        assert error is not None and isinstance(error.cause, Timeout)
        assert "may or may not be published" in str(error)
    elif too_big is not None:
        assert error is not None and error.cause.code == "E_BAD_MESSAGE", error
        assert published == too_big and f"message {too_big + 1} " in str(error)
    else:
        assert error is None and published == n


def test_a_single_message_over_the_limit_is_named_and_the_rest_before_it_published():
    server = ScriptedNsqd(max_body_size=200, max_msg_size=50)
    bodies = [b"%02d" % i + b"x" * 10 for i in range(30)]
    bodies[17] = b"17" + b"y" * 60
    with Producer("s:1", Config(), dial=server.dial) as p, pytest.raises(PublishError) as e:
        p.publish_iter("t", bodies, batch_size=10)
    assert e.value.published == 17 and e.value.failed == 13
    assert "message 18 (62 bytes) refused by nsqd" in str(e.value) and "E_BAD_MESSAGE" in str(e.value)
    assert server.held == bodies[:17]


def test_a_smaller_body_limit_is_learned_not_retried_for_every_batch():
    server = ScriptedNsqd(max_body_size=1000)
    bodies = [b"%04d" % i + b"z" * 96 for i in range(400)]  # 500-message batches: 52 kB each
    with Producer("s:1", Config(), dial=server.dial) as p:
        result = p.publish_iter("t", bodies, batch_size=500, window=4)
    assert result.published == 400 and server.held == bodies
    refusals = sum(1 for c in server.conns if c.dead)
    assert refusals <= 8, refusals  # log2(52 kB / 1 kB) splits, then batches fit


# -- a replaced connection fails its own publishes at once ----------------------------------------
def test_publishes_of_a_dead_connection_fail_at_once_even_after_it_was_replaced():
    server = ScriptedNsqd(["stall"] * 4)  # four publishes that will never be answered
    p = Producer("s:1", Config(), dial=server.dial)
    first = p.connection()
    futures = [p._send(first, b"PUB t\n\x00\x00\x00\x01x") for _ in range(4)]
    first._stream.feed(None)  # the connection dies (nsqd restarted) ...
    first.closed_event.wait(5)
    second = p.connection()  # ... and is replaced by a new one to the same address
    assert second is not first
    t0 = time.monotonic()
    for fut in futures:
        with pytest.raises(TransportError, match="connection lost before nsqd answered"):
            fut.result(3.0)
    assert time.monotonic() - t0 < 1.0  # failed when the connection closed, not after 3 s each
    p.close(1.0)
    server.close()


def test_a_publish_that_times_out_is_not_sent_again():
    server = ScriptedNsqd(["stall"])
    with Producer(["s:1", "s:2"], Config(), dial=server.dial) as p:
        with pytest.raises(PublishError, match="may or may not be published|not known whether published") as e:
            p.publish("t", b"once", timeout=0.3)
        assert isinstance(e.value.cause, Timeout)
        with pytest.raises(PublishError) as e:
            p.publish_iter("t", [b"a", b"b"], timeout=0.3) if server.plan.append("stall") is None else None
        assert e.value.published == 0
    assert server.actions == ["stall", "stall"]  # each publish met the server once: never resent


@pytest.mark.parametrize("source, error", [
    ([[b"a", b"b"], [b"c", b"", b"d"]], "message 4 is empty"),
    ([b"a", [b"b", "c", bytearray(b"d")], [b"e", b"x" * 50]], "message 6 is 50 bytes, over the 40-byte max"),
])
def test_a_bad_body_in_a_list_is_named_by_its_place_in_the_whole_source(source, error):
    """A list is taken whole only when every body checks out; otherwise body by body, so the
    error names the same message as if the bodies had come one at a time, and the ones before
    it are published (str and bytearray in a list are encoded like bare ones)."""
    server = ScriptedNsqd([])
    p = Producer(["s:1"], Config(max_msg_size=40), dial=server.dial)
    try:
        with pytest.raises(PublishError, match=error) as e:
            p.publish_iter("t", source, batch_size=2)
    finally:
        p.close(1.0)
        server.close()
    flat = [b for g in source for b in (g if isinstance(g, list) else [g])]
    good = flat[:int(error.split()[1]) - 1]
    assert e.value.published == len(good) and server.held == [bytes(b) if not isinstance(b, str) else b.encode()
                                                                  for b in good]
