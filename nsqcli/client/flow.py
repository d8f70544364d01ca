"""PURE flow control: how much RDY each connection gets, and backoff. No sockets, threads or
clocks: every call takes ``now`` (seconds, monotonic) and returns the RDY changes to send as a
list of ``(key, count)``, decreases first, so the total never exceeds max_in_flight.

Distribution (n connections, M = max_in_flight, or less under the byte budget below):

- n <= M: a new connection gets RDY 1 until it delivers its first message (or the next
  redistribution tick), then every established connection gets M // n, and the remainder
  M % n goes, one each, to the connections that received most recently (go-nsq #378 drops it).
  Each share is capped at that nsqd's max_rdy_count.
- n > M: M connections hold RDY 1, and RDY moves when a holder runs dry: a holder with nothing
  in flight that has delivered nothing for ``dry_timeout`` (DRY_TIMEOUT, 0.2 s) since it got its
  RDY, last delivered, or was last seen settling its messages, gives its RDY up at once (next_wakeup
  says when that is due). nsqd sends the next message within a round trip of a FIN when it has one,
  so a holder that keeps delivering keeps its RDY, and one whose nsqd is empty hands over in a
  fraction of a second - not after go-nsq's idle timer (10 s + up to one 5 s redistribution).
  Free RDY goes to the connection that held it least recently (never: first; ties at random), so
  when no nsqd has messages every one gets its turn within ceil((n - M) / M) rounds of
  hand-overs (a dry holder with no other connection to take over keeps it and waits another
  dry_timeout; the one that held longest goes first). Every redistribution tick, holders idle
  longer than low_rdy_idle_timeout or holding longer than low_rdy_timeout give it up too, so a
  busy nsqd never keeps it for ever (go-nsq #179/#208).
  The flow has no settle times (settled() takes no clock): it sees a holder busy at one tick
  and settled at a later one, and counts its quiet time from that later tick - a message held
  long by its handler is not followed by an instant hand-over, racing nsqd's next message.

Byte budget (max_in_flight_bytes, 0 = none): received() is told the body bytes too, and the
flow keeps an average message size (it jumps up to a bigger batch's mean at once - memory first -
and decays towards smaller ones, 10 % per message). M is then at most budget // average, never
below 1, so big messages mean a small RDY: ten 10 MB messages in flight, not two hundred. A
lower M applies at once; a higher one when it is 25 % above the current, or at the next
redistribution tick (no RDY churn from every message).

Backoff (go-nsq's consumer-wide counter): a failure raises the level (while the next duration
stays within max_backoff_duration), sets RDY 0 everywhere and starts a timer of
multiplier * 2**level (or a full-jitter draw below it). Results that arrive while the timer runs
are ignored: one result counts per window. When the timer expires one random connection gets
RDY 1 to test the water; its success lowers the level (and, above 0, waits again), its failure
raises it. A tester that delivers nothing for ``test_timeout`` (1 s: its nsqd is empty or frozen)
hands RDY 1 to another connection. At level 0 full speed resumes. max_backoff_duration = 0 disables backoff.
Whenever the level is above 0 and no timer runs, exactly one live connection holds RDY 1: if
the test connection is lost, another one (or the next to connect) takes over at once.
"""

from __future__ import annotations

import random

STARVED_RATIO = 0.85
#: weight of each smaller message in the average message size (bigger ones count at once)
SIZE_DECAY = 0.1
#: the byte-budget limit rises only when it grew by this factor (or at a redistribution tick)
LIMIT_GROWTH = 1.25
#: n > M: a holder with nothing in flight that delivered nothing this long hands its RDY on.
#: nsqd answers a FIN with the next message within a round trip when it has one; a new holder's
#: first message comes after the consumer's 50 ms RDY_SETTLE. Measured over 40 nsqd, also with
#: both cores busy: the longest wait for a holder's next message was 75 ms (bench/figures.md)
DRY_TIMEOUT = 0.2
#: a tick at ``now + next_wakeup(now)`` can land a rounding error before the time it was for
CLOCK_SLACK = 1e-9


class ConnFlow:
    """One connection's flow state (slots: set on every message, read on every RDY decision)."""

    __slots__ = ("key", "max_rdy", "rdy", "in_flight", "last_message", "rdy_since", "established",
                 "released", "seen_busy", "quiet_since")

    def __init__(self, key: object, max_rdy: int, rdy: int = 0, in_flight: int = 0, last_message: float = 0.0,
                 rdy_since: float = 0.0, established: bool = False):
        self.key, self.max_rdy, self.rdy, self.in_flight = key, max_rdy, rdy, in_flight
        self.last_message, self.rdy_since, self.established = last_message, rdy_since, established
        self.released = float("-inf")  # when it last gave its RDY up (never: first in line)
        self.seen_busy = False         # a tick saw it holding RDY with messages in flight
        self.quiet_since = float("-inf")  # the tick that saw those messages settled

    def __repr__(self) -> str:
        return f"ConnFlow({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


class Flow:
    def __init__(self, max_in_flight: int, *, backoff_multiplier: float = 1.0,
                 max_backoff_duration: float = 120.0, backoff_strategy: str = "exponential",
                 low_rdy_idle_timeout: float = 10.0, low_rdy_timeout: float = 30.0,
                 redistribute_interval: float = 5.0, max_in_flight_bytes: int = 0,
                 test_timeout: float = 1.0, dry_timeout: float | None = None,
                 rng: random.Random | None = None):
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        if backoff_strategy not in ("exponential", "full_jitter"):
            raise ValueError(f"unknown backoff strategy {backoff_strategy!r}")
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max(0, max_in_flight_bytes)
        self.avg_size: float | None = None  # bytes per message, once some arrived
        self.limit = max_in_flight          # max_in_flight within the byte budget
        self.multiplier = backoff_multiplier
        self.max_backoff = max_backoff_duration
        self.strategy = backoff_strategy
        self.idle_timeout = low_rdy_idle_timeout
        self.hold_timeout = low_rdy_timeout
        self.redistribute_interval = redistribute_interval
        self.test_timeout = test_timeout  # a tester that delivers nothing this long hands over
        self.dry_timeout = DRY_TIMEOUT if dry_timeout is None else dry_timeout
        self.rng = rng or random.Random()
        self.conns: dict[object, ConnFlow] = {}
        self.level = 0
        self.backoff_until: float | None = None
        self.test_key: object | None = None
        self._next_redistribute: float | None = None  # set by the first tick

    # -- queries -----------------------------------------------------------------------------
    @property
    def total_rdy(self) -> int:
        return sum(c.rdy for c in self.conns.values())

    @property
    def in_backoff(self) -> bool:
        return self.level > 0 or self.backoff_until is not None

    def is_starved(self) -> bool:
        """True when some connection has (nearly) all its RDY in flight: time to flush a batch."""
        return any(c.in_flight > 0 and c.in_flight >= STARVED_RATIO * c.rdy for c in self.conns.values())

    def backoff_state(self, now: float) -> str:
        if self.backoff_until is not None:
            return f"backoff L{self.level} {max(0.0, self.backoff_until - now):.1f}s"
        if self.level > 0:
            return f"testing L{self.level}"
        return ""

    def duration(self, level: int) -> float:
        full = self.multiplier * (2 ** level)
        if self.strategy == "full_jitter":
            return self.rng.uniform(0, full)
        return full

    def next_wakeup(self, now: float) -> float:
        """Seconds until tick() has something to do."""
        wake = self._next_redistribute if self._next_redistribute is not None else now
        if self.backoff_until is not None:
            wake = min(wake, self.backoff_until)
        tester = self.conns.get(self.test_key) if self.level > 0 else None
        if tester is not None and tester.rdy > 0 and len(self.conns) > 1:
            wake = min(wake, max(tester.rdy_since, tester.last_message) + self.test_timeout)
        if self._rotating:
            wake = min([wake] + [self._dry_at(c, now) for c in self.conns.values() if c.rdy > 0])
        return max(0.0, wake - now)

    def _dry_at(self, c: ConnFlow, now: float) -> float:
        """When tick() should look at holder ``c`` again: the end of its quiet time, or - while
        it has messages in flight, or settled them since a tick saw them - soon, to see that."""
        if c.in_flight > 0:
            return now + self.dry_timeout
        if c.seen_busy:
            return now
        return max(c.rdy_since, c.last_message, c.quiet_since) + self.dry_timeout

    # -- connections -------------------------------------------------------------------------
    def add(self, key, max_rdy: int, now: float) -> list:
        self.conns[key] = ConnFlow(key, max(1, max_rdy), last_message=now)
        return self._apply(now)

    def remove(self, key, now: float) -> list:
        self.conns.pop(key, None)
        if self.test_key == key:
            self.test_key = None
        return self._apply(now)

    def set_max_in_flight(self, n: int, now: float) -> list:
        if n < 0:
            raise ValueError("max_in_flight must be >= 0")
        self.max_in_flight = n
        self.limit = self._budget_limit()
        return self._apply(now)

    # -- the byte budget ------------------------------------------------------------------------
    def _budget_limit(self) -> int:
        """max_in_flight, lowered so that limit x average size stays within the byte budget."""
        m = self.max_in_flight
        if m == 0 or not self.max_in_flight_bytes or not self.avg_size:
            return m
        return max(1, min(m, int(self.max_in_flight_bytes // self.avg_size)))

    def _observe_sizes(self, n: int, nbytes: int) -> bool:
        """Fold a batch's body sizes into the average; True when the limit changed."""
        if not self.max_in_flight_bytes or n <= 0:
            return False
        mean = nbytes / n
        if self.avg_size is None or mean >= self.avg_size:
            self.avg_size = mean
        else:
            keep = (1 - SIZE_DECAY) ** n
            self.avg_size = self.avg_size * keep + mean * (1 - keep)
        limit = self._budget_limit()
        if limit < self.limit or limit >= self.limit * LIMIT_GROWTH:
            self.limit = limit
            return True
        return False

    # -- messages and results ---------------------------------------------------------------
    def received(self, key, n: int, now: float, nbytes: int = 0) -> list:
        """``n`` messages with ``nbytes`` of bodies in all arrived on ``key``."""
        c = self.conns.get(key)
        if c is None:
            return []
        c.in_flight += n
        c.last_message = now
        resized = self._observe_sizes(n, nbytes)
        if not c.established or resized:
            c.established = True
            return self._apply(now)
        return []

    def settled(self, key, n: int = 1) -> None:
        """n messages of this connection were FINed or REQed (or lost with the connection)."""
        c = self.conns.get(key)
        if c is not None:
            c.in_flight = max(0, c.in_flight - n)

    def success(self, now: float) -> list:
        if self.backoff_until is not None or self.level == 0:
            return []
        self.level -= 1
        if self.level == 0:
            self.test_key = None
            return self._apply(now)
        return self._start_timer(now)

    def failure(self, now: float) -> list:
        if self.max_backoff <= 0 or self.backoff_until is not None:
            return []
        if self.multiplier * (2 ** (self.level + 1)) <= self.max_backoff:
            self.level += 1
        if self.level == 0:  # max_backoff below the first step: nothing to do
            return []
        return self._start_timer(now)

    def neutral(self, now: float) -> list:
        """A requeue without backoff: while testing, wait again at the same level."""
        if self.backoff_until is not None or self.level == 0:
            return []
        return self._start_timer(now)

    def _start_timer(self, now: float) -> list:
        self.backoff_until = now + min(self.duration(self.level), self.max_backoff)
        self.test_key = None
        return self._apply(now)

    # -- time ----------------------------------------------------------------------------------
    def tick(self, now: float) -> list:
        changes = []
        if self.backoff_until is not None and now >= self.backoff_until:
            self.backoff_until = None
            self.test_key = None  # _apply picks a random one
            changes += self._apply(now)
        elif self._tester_idle(now):
            # the tester's nsqd has nothing to give (or is frozen): another one tests, else a
            # consumer of several nsqd waited for ever while the others held messages
            self.test_key = self.rng.choice(sorted((k for k in self.conns if k != self.test_key), key=str))
            changes += self._apply(now)
        dry = self._look_at_holders(now)
        due = self._redistribution_due(now)
        if self._rotating:
            if dry or due:
                changes += self._rotate(dry, self._stale(now) if due else set(), now)
        elif due:
            changes += self._apply(now)
        return changes

    def _redistribution_due(self, now: float) -> bool:
        """The redistribution tick: every connection counts as established, the byte-budget
        limit may rise."""
        if self._next_redistribute is None:
            self._next_redistribute = now + self.redistribute_interval
            return False
        if now < self._next_redistribute:
            return False
        self._next_redistribute = now + self.redistribute_interval
        self.limit = self._budget_limit()
        for c in self.conns.values():
            c.established = True
        return True

    @property
    def _rotating(self) -> bool:
        return not self.in_backoff and len(self.conns) > self.limit > 0

    def _look_at_holders(self, now: float) -> set:
        """Note which holders are busy or settled since the last look (every tick, whatever the
        regime), and return those that ran dry: nothing in flight, nothing delivered for
        dry_timeout since they got RDY, last delivered or were seen settling."""
        dry = set()
        for k, c in self.conns.items():
            if c.rdy == 0:
                continue
            if c.in_flight > 0:
                c.seen_busy = True
                continue
            if c.seen_busy:  # settled since the last look: its quiet time starts now
                c.seen_busy, c.quiet_since = False, now
            if now + CLOCK_SLACK >= max(c.rdy_since, c.last_message, c.quiet_since) + self.dry_timeout:
                dry.add(k)
        return dry

    def _stale(self, now: float) -> set:
        """Holders idle longer than low_rdy_idle_timeout or holding longer than low_rdy_timeout."""
        return {k for k, c in self.conns.items() if c.rdy > 0 and (
            now - c.last_message > self.idle_timeout or now - c.rdy_since > self.hold_timeout)}

    def _rotate(self, dry: set, stale: set, now: float) -> list:
        """n > limit: take RDY from the dry and stale holders, give it to the connections that
        held it least recently. A dry holder keeps it only when no other connection is left to
        take it, and starts a new quiet time (else tick() would be due again at once, and again)."""
        dropped = dry | stale
        keep = [k for k, c in self.conns.items() if c.rdy > 0 and k not in dropped]
        changes = self._assign_rotation(keep, dropped, now)
        for k in dry:
            if self.conns[k].rdy > 0:
                self.conns[k].quiet_since = now
        return changes

    # -- targets ---------------------------------------------------------------------------------
    def _targets(self) -> dict:
        conns, m = self.conns, self.limit
        if m == 0 or self.backoff_until is not None:
            return {k: 0 for k in conns}
        if self.level > 0:
            return {k: (1 if k == self.test_key else 0) for k in conns}
        new = [k for k, c in conns.items() if not c.established]
        est = sorted((c for c in conns.values() if c.established),
                     key=lambda c: (-c.last_message, str(c.key)))
        budget = m - len(new)
        targets = {k: 1 for k in new}
        if est:
            base, extra = divmod(budget, len(est))
            for i, c in enumerate(est):
                targets[c.key] = min(base + (1 if i < extra else 0), c.max_rdy)
        return targets

    def _tester_idle(self, now: float) -> bool:
        """Testing the water, and the tester has held RDY 1 for test_timeout without a message
        (nothing in flight to wait for), while other connections could test instead."""
        if self.level == 0 or self.backoff_until is not None or len(self.conns) < 2:
            return False
        c = self.conns.get(self.test_key)
        return (c is not None and c.rdy > 0 and c.in_flight == 0
                and now - max(c.rdy_since, c.last_message) >= self.test_timeout)

    def _pick_tester(self) -> None:
        """Level > 0 and no timer: exactly one live connection tests the water. When the test
        connection is lost (or there was none when the timer fired) another one - or the next
        one to arrive - takes over; otherwise nothing would ever send RDY again (go-nsq PR #106)."""
        if self.level == 0 or self.backoff_until is not None or self.test_key in self.conns:
            return
        self.test_key = self.rng.choice(sorted(self.conns, key=str)) if self.conns else None

    def _apply(self, now: float) -> list:
        self._pick_tester()
        if self._rotating:
            keep = [k for k, c in self.conns.items() if c.rdy > 0]
            return self._assign_rotation(keep, set(), now)
        return self._emit(self._targets(), now)

    def _assign_rotation(self, keep: list, avoid: set, now: float) -> list:
        """RDY 1 to ``keep`` (up to the limit), the rest of the limit to the connections that
        held RDY least recently (those that never did first, ties at random); ``avoid`` last,
        and of those the one that has held RDY longest gives it up first."""
        keep = sorted(keep, key=str)[: self.limit]
        others = sorted((k for k in self.conns if k not in keep), key=str)
        self.rng.shuffle(others)
        conns = self.conns
        others.sort(key=lambda k: (1, -conns[k].rdy_since) if k in avoid else (0, conns[k].released))
        chosen = set(keep + others[: self.limit - len(keep)])
        return self._emit({k: (1 if k in chosen else 0) for k in self.conns}, now)

    def _emit(self, targets: dict, now: float) -> list:
        down, up = [], []
        for k, n in targets.items():
            c = self.conns[k]
            if n == c.rdy:
                continue
            if c.rdy == 0:
                c.rdy_since = now
            elif n == 0:
                c.released, c.seen_busy = now, False
            (down if n < c.rdy else up).append((k, n))
            c.rdy = n
        return down + up
