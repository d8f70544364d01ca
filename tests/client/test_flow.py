"""RDY distribution and backoff transcripts with an injected clock: no sleeps, no sockets; and a
stateful property test of the same Flow against a small model."""

import math
import random

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule

from nsqcli.client.flow import CLOCK_SLACK, Flow


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
                budget=st.sampled_from([0, 1000, 64 * MiB]), seed=st.integers(0, 2 ** 16),
                dry=st.sampled_from([0.05, 0.2, 1.0]))
    def setup(self, mif, strategy, budget, seed, dry):
        self.begin(Flow(mif, backoff_multiplier=0.5, max_backoff_duration=20.0, backoff_strategy=strategy,
                        low_rdy_idle_timeout=10.0, low_rdy_timeout=30.0, redistribute_interval=5.0,
                        max_in_flight_bytes=budget, dry_timeout=dry, rng=random.Random(seed)))

    def begin(self, flow):
        self.flow = flow
        self.now = 0.0
        self.sent: dict[str, int] = {}       # RDY as the nsqds were told, change by change
        self.in_flight: dict[str, int] = {}
        self.next_key = 0
        # the dry rule (n > max_in_flight), as a spec: a holder's quiet time starts when it got
        # RDY, last received, or when a tick saw settled what an earlier tick saw in flight
        self.granted: dict[str, float] = {}   # last RDY 0 -> n
        self.released: dict[str, float] = {}  # last RDY n -> 0
        self.last_msg: dict[str, float] = {}
        self.quiet: dict[str, float] = {}
        self.busy_look: set[str] = set()      # holders a tick saw with messages in flight

    def send(self, changes):
        """Apply changes in order: the running total never goes above max_in_flight, except
        that the cuts of a lowered max_in_flight come before any raise."""
        raised = False
        for key, n in changes:
            assert key in self.sent, "RDY for a connection that is gone"
            if n > self.sent[key]:
                raised = True
            if self.sent[key] == 0 < n:
                self.granted[key] = self.now
            elif n == 0 < self.sent[key]:
                self.released[key] = self.now
                self.busy_look.discard(key)
            self.sent[key] = n
            if raised:
                assert sum(self.sent.values()) <= self.flow.max_in_flight, changes
        assert self.sent == {k: c.rdy for k, c in self.flow.conns.items()}

    @rule(target=conns, max_rdy=st.sampled_from([1, 2, 3, 2500]))
    def add(self, max_rdy):
        return self.add_one(max_rdy)

    def add_one(self, max_rdy):
        key = f"c{self.next_key}"
        self.next_key += 1
        self.sent[key] = 0
        self.in_flight[key] = 0
        self.granted[key] = self.released[key] = self.quiet[key] = -math.inf
        self.last_msg[key] = self.now
        self.send(self.flow.add(key, max_rdy, self.now))
        return key

    @rule(key=consumes(conns))
    def remove(self, key):
        del self.sent[key], self.in_flight[key]
        self.busy_look.discard(key)
        self.send(self.flow.remove(key, self.now))

    @rule(key=conns, n=st.integers(1, 5), size=st.sampled_from([0, 10, 100, 400, 3000]))
    def receive(self, key, n, size):
        n = min(n, max(1, self.sent[key] - self.in_flight[key]))  # nsqd sends up to RDY (+ a late one)
        self.in_flight[key] += n
        self.last_msg[key] = self.now
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
        self.tick_and_check()

    @rule()
    def tick_when_due(self):
        self.now += self.flow.next_wakeup(self.now)
        self.tick_and_check()

    @rule(dt=st.sampled_from([0.01, 0.04, 0.15, 0.2, 0.25, 0.6]))
    def tick_soon(self, dt):
        self.now += dt
        self.tick_and_check()

    def dry_holders(self) -> set:
        dry = self.flow.dry_timeout
        return {k for k, n in self.sent.items() if n > 0 and self.in_flight[k] == 0
                and self.now + CLOCK_SLACK >= max(self.granted[k], self.last_msg[k], self.quiet[k]) + dry}

    def tick_and_check(self):
        """A tick, and the dry rule: every holder that ran dry gives its RDY up - unless no
        connection is left to take it (every one without RDY gave it up at this very tick);
        then it starts a new quiet time."""
        for k, n in self.sent.items():  # what the tick sees before it decides
            if n and self.in_flight[k]:
                self.busy_look.add(k)
            elif n and k in self.busy_look:
                self.busy_look.discard(k)
                self.quiet[k] = self.now
        dry = self.dry_holders()
        holders_before = {k for k, n in self.sent.items() if n}
        self.send(self.flow.tick(self.now))
        f = self.flow
        if not f._rotating:
            return
        if len(holders_before) <= f.limit:  # and no holder that keeps delivering loses it
            for k in holders_before - dry:
                assert self.sent[k] or (self.now - self.last_msg[k] > f.idle_timeout
                                        or self.now - self.granted[k] > f.hold_timeout), (k, "not dry")
        kept = {k for k in dry if self.sent[k]}
        if kept:
            assert all(self.released[k] == self.now for k, n in self.sent.items() if n == 0), (
                kept, self.sent, self.released, self.now)
            for k in kept:
                self.quiet[k] = self.now

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

    @invariant()
    def wakes_up_when_a_holder_runs_dry(self):
        """next_wakeup() is no later than the end of any holder's quiet time, and while a
        holder has messages in flight it looks again within dry_timeout (to see them settled)."""
        f = self.flow
        if not f._rotating:
            return
        wake, dry = f.next_wakeup(self.now), f.dry_timeout
        for k, n in self.sent.items():
            if n and self.in_flight[k]:
                assert wake <= dry + 1e-9, (k, wake)
            elif n and k not in self.busy_look:
                due = max(self.granted[k], self.last_msg[k], self.quiet[k]) + dry - self.now
                assert wake <= max(0.0, due) + 1e-9, (k, wake, due)


FlowMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                         derandomize=True, database=None)
test_flow_state_machine = FlowMachine.TestCase


class DryFlowMachine(FlowMachine):
    """The same rules and invariants, started where the dry rule works: more connections than
    max_in_flight (1-3 over 2-7), so most steps happen in the n > max_in_flight regime."""

    @initialize(target=FlowMachine.conns, mif=st.integers(1, 3), n=st.integers(2, 7),
                seed=st.integers(0, 2 ** 16), dry=st.sampled_from([0.05, 0.2, 1.0]))
    def setup(self, mif, n, seed, dry):
        self.begin(Flow(mif, backoff_multiplier=0.5, max_backoff_duration=20.0, low_rdy_idle_timeout=10.0,
                        low_rdy_timeout=30.0, redistribute_interval=5.0, dry_timeout=dry,
                        rng=random.Random(seed)))
        return multiple(*(self.add_one(2500) for _ in range(n)))


DryFlowMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                            derandomize=True, database=None)
test_dry_flow_state_machine = DryFlowMachine.TestCase


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


# -- n > max_in_flight: RDY moves when a holder runs dry (issue 32) ---------------------------------
def spread(n, mif, **kw):
    """n connections over max_in_flight mif, all added at 0.0, the first tick done."""
    f = make(mif, dry_timeout=0.2, **kw)
    for i in range(n):
        f.add(f"n{i}", 2500, 0.0)
    f.tick(0.0)
    return f


def test_a_dry_holder_hands_its_rdy_over_at_dry_timeout():
    f = spread(2, 1)
    [h] = holders(f)
    [other] = [k for k in f.conns if k != h]
    assert f.received(h, 1, 0.05) == []
    f.settled(h, 1)
    assert f.next_wakeup(0.05) == pytest.approx(0.2)  # 0.05 + dry_timeout: the consumer's sleep
    assert f.tick(0.24) == []
    assert f.tick(0.25) == [(h, 0), (other, 1)]
    assert f.next_wakeup(0.25) == pytest.approx(0.2)  # the new holder's quiet time


def test_a_holder_that_keeps_delivering_keeps_its_rdy():
    f = spread(5, 2)
    first = holders(f)
    t = 0.0
    while t < 9.0:  # below low_rdy_timeout (30 s): no hand-over, no RDY churn at all
        t += 0.15
        for k in first:
            f.received(k, 1, t)
            f.settled(k, 1)
        assert f.tick(t) == []
        assert f.next_wakeup(t) <= 0.2 + 1e-9  # or the redistribution tick, sooner
    assert holders(f) == first


def test_a_message_held_long_by_its_handler_keeps_the_rdy_until_a_tick_sees_it_settled():
    f = spread(2, 1)
    [h] = holders(f)
    f.received(h, 1, 0.1)
    assert f.next_wakeup(0.3) == pytest.approx(0.2)  # in flight: look again within dry_timeout
    for t in (0.3, 0.5, 2.0, 4.0):
        assert f.tick(t) == []
    f.settled(h, 1)                   # at about 4.05 - the flow is told no time
    assert f.next_wakeup(4.1) == 0    # seen busy, now settled: look at once
    assert f.tick(4.1) == []          # its quiet time starts at this look: nsqd may send the next
    assert f.next_wakeup(4.1) == pytest.approx(0.2)
    f.received(h, 1, 4.1005)          # ... and it did: the holder keeps its RDY
    f.settled(h, 1)
    assert f.tick(4.3) == []
    assert f.tick(4.3005)[0] == (h, 0)  # 0.2 s after that message: dry


def test_rdy_goes_round_robin_to_the_least_recently_held():
    """Nothing anywhere: every connection holds RDY once before any holds it twice, and the
    rounds repeat in the same order."""
    f = spread(6, 2)
    rounds = [set(holders(f))]
    t = 0.0
    for _ in range(8):
        t += f.next_wakeup(t)
        changes = f.tick(t)
        assert sorted(n for _, n in changes) == [0, 0, 1, 1]
        rounds.append({k for k, n in changes if n})
    assert set().union(*rounds[:3]) == set(f.conns)  # ceil((6 - 2) / 2) hand-overs: all had it
    assert rounds[3:6] == rounds[:3] and rounds[6:9] == rounds[:3]
    assert t == pytest.approx(8 * 0.2)


def test_a_new_connection_is_first_in_line():
    f = spread(4, 1)
    t = 0.0
    for _ in range(3):  # three hand-overs: n1..n3 all had RDY once
        t += f.next_wakeup(t)
        f.tick(t)
    f.add("new", 2500, t)
    t += f.next_wakeup(t)
    assert [k for k, n in f.tick(t) if n] == ["new"]


def test_one_spare_connection_takes_turns_with_the_longest_holder():
    """5 in flight over 6 nodes, all dry: one moves per dry_timeout, the longest holder first;
    the others start a new quiet time (next_wakeup is never 0 in a loop)."""
    f = spread(6, 5)
    t, out = 0.0, []
    for _ in range(12):
        wait = f.next_wakeup(t)
        assert wait == pytest.approx(0.2)
        t += wait
        changes = f.tick(t)
        assert len(changes) == 2 and f.total_rdy == 5
        out.append(changes[0][0])  # who gave RDY up
    assert set(out[:6]) == set(f.conns) and out[6:] == out[:6]


def test_no_dry_rule_when_every_connection_has_rdy():
    f = make(10, dry_timeout=0.2)
    for k in "ab":
        f.add(k, 2500, 0.0)
        f.received(k, 1, 0.0)
        f.settled(k, 1)
    f.tick(0.0)
    before = rdy(f)
    for t in (0.3, 1.0, 4.0, 9.0):
        assert f.tick(t) == []
        assert f.next_wakeup(t) > 0.2
    assert rdy(f) == before


def test_no_dry_rule_while_testing_the_water():
    f = spread(4, 2, backoff_multiplier=1.0)
    f.failure(0.1)  # level 1, timer to 2.1
    assert f.tick(2.1) and f.total_rdy == 1
    [tester] = holders(f)
    assert f.next_wakeup(2.1) == pytest.approx(1.0)  # the tester's test_timeout, not dry_timeout
    assert f.tick(2.5) == []
    assert holders(f) == [tester]


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(n=st.integers(2, 12), mif=st.integers(1, 11), seed=st.integers(0, 2 ** 16))
def test_every_connection_gets_rdy_within_the_rounds_when_all_are_dry(n, mif, seed):
    """No nsqd has messages: each connection holds RDY within ceil((n - M) / M) hand-over rounds,
    the total stays at M, and next_wakeup() paces the rounds at dry_timeout."""
    f = Flow(mif, dry_timeout=0.2, rng=random.Random(seed))
    for i in range(n):
        f.add(f"n{i}", 2500, 0.0)
    f.tick(0.0)
    had = set(holders(f))
    t = 0.0
    rounds = math.ceil(max(0, n - mif) / mif)
    for _ in range(rounds):
        wait = f.next_wakeup(t)
        assert wait == pytest.approx(0.2)
        t += wait
        f.tick(t)
        assert f.total_rdy == min(n, mif)
        had |= set(holders(f))
    assert had == set(f.conns)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(mif=st.integers(1, 4), spare=st.integers(1, 6), wet=st.sets(st.integers(0, 9)), seed=st.integers(0, 2 ** 16))
def test_every_connection_gets_rdy_while_some_nsqd_always_have_messages(mif, spare, wet, seed):
    """Some nsqd always have a message when they hold RDY (they deliver every 0.1 s): they keep
    RDY until low_rdy_timeout, never longer; every connection still gets its turn, within
    about ceil(n / M) holding times."""
    n, hold, interval = mif + spare, 3.0, 1.0
    f = Flow(mif, dry_timeout=0.2, low_rdy_idle_timeout=2.0, low_rdy_timeout=hold,
             redistribute_interval=interval, rng=random.Random(seed))
    keys = [f"n{i}" for i in range(n)]
    for k in keys:
        f.add(k, 2500, 0.0)
    wet = {keys[i] for i in wet if i < n}
    had, t = set(), 0.0
    limit = (math.ceil(n / mif) + 1) * (hold + interval + 0.2)
    while t < limit and had != set(keys):
        t += max(0.001, min(0.1, f.next_wakeup(t)))  # wet holders deliver at each step
        for k in holders(f):
            had.add(k)
            if k in wet:
                f.received(k, 1, t)
                f.settled(k, 1)
        f.tick(t)
        assert f.total_rdy == mif
    assert had == set(keys), (t, had)
