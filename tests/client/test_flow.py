"""RDY distribution and backoff transcripts with an injected clock: no sleeps, no sockets; and a
stateful property test of the same Flow against a small model."""

import random

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from nsqcli.client.flow import Flow


def make(mif, **kw):
    kw.setdefault("rng", random.Random(7))
    return Flow(mif, **kw)


def rdy(flow):
    return {k: c.rdy for k, c in flow.conns.items()}


def test_new_connection_starts_at_one_then_gets_full_share():
    f = make(200)
    assert f.add("a", 2500, 0.0) == [("a", 1)]
    assert f.received("a", 1, 0.1) == [("a", 200)]
    assert f.total_rdy == 200


def test_remainder_is_not_lost():  # go-nsq #378: 9 over 6 conns gives 1 each there
    f = make(9)
    for i, k in enumerate("abcdef"):
        f.add(k, 2500, 0.0)
        f.received(k, 1, float(i))
    assert f.total_rdy == 9
    # the three most recently active get the extra one
    assert rdy(f) == {"a": 1, "b": 1, "c": 1, "d": 2, "e": 2, "f": 2}


def test_total_never_exceeds_max_in_flight_while_conns_come_and_go():
    f = make(10)
    t = 0.0
    rng = random.Random(1)
    keys = []
    for step in range(500):
        t += 0.1
        if keys and rng.random() < 0.3:
            f.remove(keys.pop(rng.randrange(len(keys))), t)
        else:
            k = f"c{step}"
            keys.append(k)
            f.add(k, rng.choice([1, 3, 2500]), t)
        if keys and rng.random() < 0.5:
            f.received(rng.choice(keys), 1, t)
        f.tick(t)
        assert f.total_rdy <= 10
        assert all(c.rdy <= c.max_rdy for c in f.conns.values())


def test_max_rdy_count_caps_a_share():
    f = make(100)
    f.add("a", 10, 0.0)
    f.received("a", 1, 0.0)
    assert rdy(f) == {"a": 10}


def test_decreases_are_sent_before_increases():
    f = make(4)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.0)
    assert rdy(f) == {"a": 4}
    f.add("b", 2500, 1.0)
    changes = f.received("b", 1, 1.0)
    assert changes == [("a", 2), ("b", 2)]


def test_fewer_in_flight_than_connections_rotates_to_every_node():
    f = make(1, low_rdy_idle_timeout=10, low_rdy_timeout=30, redistribute_interval=5)
    for k in "abc":
        f.add(k, 2500, 0.0)
    assert f.total_rdy == 1
    holders = set()
    t = 0.0
    f.tick(t)
    for _ in range(60):
        t += 5.0
        # whoever holds RDY receives a message now and then
        for k, c in f.conns.items():
            if c.rdy:
                holders.add(k)
                f.received(k, 1, t)
                f.settled(k, 1)
        f.tick(t)
        assert f.total_rdy <= 1
    assert holders == {"a", "b", "c"}  # busy holders still give it up after low_rdy_timeout


def test_backoff_sequence():
    f = make(10, backoff_multiplier=1.0, max_backoff_duration=120.0)
    f.add("a", 2500, 0.0)
    f.add("b", 2500, 0.0)
    f.received("a", 1, 0.0)
    f.received("b", 1, 0.0)
    assert f.total_rdy == 10
    # a failure: RDY 0 everywhere, timer 2 s (multiplier * 2**1)
    assert sorted(f.failure(1.0)) == [("a", 0), ("b", 0)]
    assert f.level == 1 and f.backoff_until == 3.0
    # results during the window are ignored
    assert f.failure(2.0) == [] and f.success(2.0) == []
    assert f.level == 1
    # timer expiry: RDY 1 on one connection
    changes = f.tick(3.0)
    assert len([c for c in changes if c[1] == 1]) == 1 and f.total_rdy == 1
    # the test message fails again: level 2, 4 s
    f.failure(3.5)
    assert f.level == 2 and f.backoff_until == 7.5 and f.total_rdy == 0
    f.tick(7.5)
    assert f.total_rdy == 1
    # success walks down one level and waits again
    f.success(8.0)
    assert f.level == 1 and f.backoff_until == 10.0 and f.total_rdy == 0
    f.tick(10.0)
    assert f.total_rdy == 1
    f.success(10.5)  # level 0: full speed
    assert f.level == 0 and f.backoff_until is None and f.total_rdy == 10
    assert f.backoff_state(11.0) == ""


def test_backoff_level_capped_by_max_duration():
    f = make(5, backoff_multiplier=1.0, max_backoff_duration=120.0)
    f.add("a", 2500, 0.0)
    t = 0.0
    for _ in range(20):
        f.failure(t)
        t = f.backoff_until
        f.tick(t)
    assert f.level == 6  # 2**7 = 128 > 120: go-nsq's effective max is 64 s
    assert f.duration(f.level) == 64.0


def test_backoff_disabled():
    f = make(5, max_backoff_duration=0)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.0)
    assert f.failure(1.0) == [] and f.total_rdy == 5


def test_neutral_requeue_keeps_level():
    f = make(5)
    f.add("a", 2500, 0.0)
    f.failure(0.0)
    f.tick(2.0)
    f.neutral(2.5)
    assert f.level == 1 and f.backoff_until == 4.5


def test_full_jitter_stays_below_exponential():
    f = make(5, backoff_strategy="full_jitter", rng=random.Random(3))
    assert all(0 <= f.duration(3) < 8 for _ in range(100))


def test_is_starved():
    f = make(10)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.0)  # rdy 10, in flight 1
    assert not f.is_starved()
    f.received("a", 8, 0.0)  # 9 >= 8.5
    assert f.is_starved()
    f.settled("a", 9)
    assert not f.is_starved()


def test_pause_with_zero_max_in_flight():
    f = make(10)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.0)
    assert f.set_max_in_flight(0, 1.0) == [("a", 0)]
    assert f.set_max_in_flight(3, 2.0) == [("a", 3)]
    with pytest.raises(ValueError):
        f.set_max_in_flight(-1, 0)


# -- backoff with connections that come and go (the RDY 0 stall) ----------------------------------
def in_testing_state(conns="ab"):
    """Level 1, the timer expired, one connection holds RDY 1 as the test connection."""
    f = make(10, backoff_multiplier=1.0)
    for k in conns:
        f.add(k, 2500, 0.0)
        f.received(k, 1, 0.0)
    f.failure(1.0)
    f.tick(3.0)
    assert f.level == 1 and f.backoff_until is None and f.total_rdy == 1
    return f


def holders(f):
    return [k for k, c in f.conns.items() if c.rdy]


def test_test_connection_drops_another_one_takes_over():
    f = in_testing_state("ab")
    [lost] = holders(f)
    [other] = [k for k in "ab" if k != lost]
    assert f.remove(lost, 3.5) == [(other, 1)]
    assert holders(f) == [other]


def test_only_connection_drops_in_testing_then_a_new_one_tests():
    f = in_testing_state("a")
    assert f.remove("a", 3.5) == []
    assert f.add("b", 2500, 4.0) == [("b", 1)]  # nsqd came back: it tests the water at once
    assert f.level == 1 and f.total_rdy == 1
    f.received("b", 1, 4.1)
    assert f.total_rdy == 1  # still testing, one message at a time
    f.success(4.2)
    assert f.level == 0 and f.total_rdy == 10


def test_every_connection_gone_when_the_timer_fires_then_one_comes_back():
    f = make(10)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.0)
    f.failure(1.0)
    f.remove("a", 2.0)
    assert f.tick(3.0) == []  # expired with nobody to test
    assert f.add("b", 2500, 3.5) == [("b", 1)]
    assert f.next_wakeup(3.5) > 0


def test_timer_still_running_when_connection_comes_back_waits_for_it():
    f = make(10)
    f.add("a", 2500, 0.0)
    f.failure(1.0)  # level 1, until 3.0
    f.remove("a", 1.5)
    assert f.add("b", 2500, 2.0) == []  # no RDY while the timer runs
    assert f.tick(3.0) == [("b", 1)]


@pytest.mark.parametrize("drop_at", range(7))
def test_backoff_transcript_with_a_drop_at_each_step(drop_at):
    """The backoff walk of test_backoff_sequence, with the connection holding RDY lost (and 'c'
    added) at one step: whatever the step, exactly one connection holds RDY whenever a level is
    set and no timer runs, and the walk ends at full speed."""
    f = make(10)
    for k in "ab":
        f.add(k, 2500, 0.0)
        f.received(k, 1, 0.0)
    t = 1.0
    steps = [lambda t: f.failure(t), lambda t: f.tick(t), lambda t: f.failure(t), lambda t: f.tick(t),
             lambda t: f.success(t), lambda t: f.tick(t), lambda t: f.success(t)]
    for i, step in enumerate(steps):
        if i == drop_at:
            f.remove((holders(f) or sorted(f.conns))[0], t)
            check_rdy(f, (i, "after the drop"))
            f.add("c", 2500, t)
            check_rdy(f, (i, "after the add"))
        step(t)
        check_rdy(f, i)
        t = f.backoff_until if f.backoff_until is not None else t + 0.5
    assert f.level == 0 and f.total_rdy == 10


def check_rdy(f, where):
    """No RDY while a timer runs; while testing exactly one holder; at full speed some holder."""
    if f.backoff_until is not None:
        assert f.total_rdy == 0, where
    elif f.conns and f.level > 0:
        assert f.total_rdy == 1 and len(holders(f)) == 1, (where, rdy(f))
    elif f.conns:
        assert f.total_rdy >= 1, (where, rdy(f))


# -- the in-flight byte budget ----------------------------------------------------------------------
MiB = 1024 * 1024


def test_big_messages_shrink_rdy_to_the_byte_budget():
    f = make(200, max_in_flight_bytes=64 * MiB)
    f.add("a", 2500, 0.0)
    assert f.received("a", 1, 0.1, nbytes=10 * MiB) == [("a", 6)]  # 6 x 10 MiB <= 64 MiB
    assert f.total_rdy * 10 * MiB <= 64 * MiB


def test_small_messages_keep_full_rdy_then_a_big_batch_cuts_it_at_once():
    f = make(200, max_in_flight_bytes=64 * MiB)
    f.add("a", 2500, 0.0)
    f.received("a", 100, 0.1, nbytes=100 * 200)
    assert rdy(f) == {"a": 200}
    assert f.received("a", 2, 0.2, nbytes=2 * 8 * MiB) == [("a", 8)]


def test_rdy_grows_back_when_messages_get_small_again():
    f = make(200, max_in_flight_bytes=64 * MiB)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.1, nbytes=32 * MiB)
    assert rdy(f) == {"a": 2}
    t = 0.1
    for _ in range(50):
        t += 0.1
        f.received("a", 10, t, nbytes=10 * 1000)
        f.tick(t)
        assert f.total_rdy <= 200
    assert rdy(f) == {"a": 200}


def test_byte_budget_never_takes_rdy_below_one():
    f = make(50, max_in_flight_bytes=1 * MiB)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.1, nbytes=100 * MiB)
    assert rdy(f) == {"a": 1}


def test_byte_budget_below_the_connection_count_rotates_one_each():
    f = make(100, max_in_flight_bytes=20 * MiB)
    for k in "abcd":
        f.add(k, 2500, 0.0)
    f.received("a", 1, 0.1, nbytes=10 * MiB)  # limit 2 for 4 connections
    assert f.total_rdy == 2 and all(c.rdy <= 1 for c in f.conns.values())


def test_no_byte_budget_ignores_sizes():
    f = make(200)
    f.add("a", 2500, 0.0)
    f.received("a", 1, 0.1, nbytes=500 * MiB)
    assert rdy(f) == {"a": 200}


# -- stateful property test: Flow against a small model ---------------------------------------------


class FlowMachine(RuleBasedStateMachine):
    """Random connection churn, messages, results and time against a model of what was sent:
    the RDY each connection was told (the changes applied in order), the messages in flight."""

    conns = Bundle("conns")

    @initialize(mif=st.integers(0, 12), strategy=st.sampled_from(["exponential", "full_jitter"]),
                budget=st.sampled_from([0, 1000, 64 * MiB]), seed=st.integers(0, 2 ** 16))
    def setup(self, mif, strategy, budget, seed):
        self.flow = Flow(mif, backoff_multiplier=0.5, max_backoff_duration=20.0, backoff_strategy=strategy,
                         low_rdy_idle_timeout=10.0, low_rdy_timeout=30.0, redistribute_interval=5.0,
                         max_in_flight_bytes=budget, rng=random.Random(seed))
        self.now = 0.0
        self.sent: dict[str, int] = {}       # RDY as the nsqds were told, change by change
        self.in_flight: dict[str, int] = {}
        self.next_key = 0

    def send(self, changes):
        """Apply changes in order: the running total never goes above max_in_flight, except
        that the cuts of a lowered max_in_flight come before any raise."""
        raised = False
        for key, n in changes:
            assert key in self.sent, "RDY for a connection that is gone"
            if n > self.sent[key]:
                raised = True
            self.sent[key] = n
            if raised:
                assert sum(self.sent.values()) <= self.flow.max_in_flight, changes
        assert self.sent == {k: c.rdy for k, c in self.flow.conns.items()}

    @rule(target=conns, max_rdy=st.sampled_from([1, 2, 3, 2500]))
    def add(self, max_rdy):
        key = f"c{self.next_key}"
        self.next_key += 1
        self.sent[key] = 0
        self.in_flight[key] = 0
        self.send(self.flow.add(key, max_rdy, self.now))
        return key

    @rule(key=consumes(conns))
    def remove(self, key):
        del self.sent[key], self.in_flight[key]
        self.send(self.flow.remove(key, self.now))

    @rule(key=conns, n=st.integers(1, 5), size=st.sampled_from([0, 10, 100, 400, 3000]))
    def receive(self, key, n, size):
        n = min(n, max(1, self.sent[key] - self.in_flight[key]))  # nsqd sends up to RDY (+ a late one)
        self.in_flight[key] += n
        self.send(self.flow.received(key, n, self.now, nbytes=n * size))

    @rule(key=conns, n=st.integers(1, 5))
    def settle(self, key, n):
        n = min(n, self.in_flight[key])
        self.in_flight[key] -= n
        self.flow.settled(key, n)

    @rule()
    def success(self):
        self.send(self.flow.success(self.now))

    @rule()
    def failure(self):
        self.send(self.flow.failure(self.now))

    @rule()
    def neutral(self):
        self.send(self.flow.neutral(self.now))

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 1.0, 5.0, 11.0, 31.0, 70.0]))
    def tick(self, dt):
        self.now += dt
        self.send(self.flow.tick(self.now))

    @rule()
    def tick_when_due(self):
        self.now += self.flow.next_wakeup(self.now)
        self.send(self.flow.tick(self.now))

    @rule(n=st.integers(0, 12))
    def set_max_in_flight(self, n):
        self.send(self.flow.set_max_in_flight(n, self.now))

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def total_within_max_in_flight(self):
        assert self.flow.total_rdy <= self.flow.max_in_flight

    @invariant()
    def total_within_the_byte_budget(self):
        f = self.flow
        if f.max_in_flight_bytes and f.avg_size:
            assert f.total_rdy <= max(1, f.max_in_flight_bytes // f.avg_size)

    @invariant()
    def each_within_its_max_rdy(self):
        assert all(0 <= c.rdy <= c.max_rdy for c in self.flow.conns.values())

    @invariant()
    def no_rdy_while_a_backoff_timer_runs(self):
        if self.flow.backoff_until is not None:
            assert self.flow.total_rdy == 0

    @invariant()
    def one_tester_while_testing_the_water(self):
        f = self.flow
        if f.level > 0 and f.backoff_until is None and f.conns and f.max_in_flight > 0:
            assert sorted(c.rdy for c in f.conns.values() if c.rdy) == [1]

    @invariant()
    def liveness_someone_can_receive(self):
        """The invariant the RDY 0 stall broke."""
        f = self.flow
        if f.conns and f.max_in_flight > 0 and f.backoff_until is None:
            assert f.total_rdy > 0, {k: c.rdy for k, c in f.conns.items()}

    @invariant()
    def in_flight_matches_the_model(self):
        assert {k: c.in_flight for k, c in self.flow.conns.items()} == self.in_flight


FlowMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                         derandomize=True, database=None)
test_flow_state_machine = FlowMachine.TestCase


def test_a_tester_whose_nsqd_has_nothing_hands_over_to_another_connection():
    """Two nsqd, one empty: when the empty one was picked to test the water, the level never
    came down and the other nsqd stayed at RDY 0 with messages waiting (a stall for ever)."""
    f = Flow(10, backoff_multiplier=1.0, rng=random.Random(0))
    f.add("a", 2500, 0.0)
    f.add("b", 2500, 0.0)
    f.failure(0.0)
    f.tick(5.0)  # the timer (2 s) is over: one of them tests
    first = f.test_key
    other = "b" if first == "a" else "a"
    assert {k: c.rdy for k, c in f.conns.items()} == {first: 1, other: 0}
    assert f.next_wakeup(5.0) == pytest.approx(1.0)
    assert f.tick(5.5) == []  # not yet
    assert f.tick(6.0) == [(first, 0), (other, 1)]  # nothing came: the other one tests
    f.received(other, 1, 6.1)
    assert f.tick(8.0) == []  # a message in flight: its result decides, no hand-over
    f.settled(other, 1)
    f.success(8.1)
    assert f.level == 0 and f.total_rdy == 10 and all(c.rdy > 0 for c in f.conns.values())


def test_a_lone_tester_keeps_testing():
    f = Flow(10, rng=random.Random(0))
    f.add("a", 2500, 0.0)
    f.failure(0.0)
    f.tick(5.0)
    assert f.tick(60.0) == [] and f.conns["a"].rdy == 1
