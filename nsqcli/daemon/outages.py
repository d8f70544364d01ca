"""Outages said truthfully: when a failure starts, while it lasts, and only when it is over.

:class:`Outages` keeps one state per ``key`` (``("source", address)`` for a consumer's nsqd or
nsqlookupd, ``"destination"``, ``"delivery"``):

- the first failure is said at once (WARNING ``TEXT``, event ``source_down``);
- repeats are counted; a changed text is said at once, the same text again only when the
  reminder is due (``TEXT (x9 since 09:45:08Z, down 31s)``);
- while it lasts, even with no new failure, a reminder at a growing interval (``remind`` s at
  first, doubling up to ``remind_max``): ``source X still down after 1m30s (12 failures since
  09:45:08Z; last: ...)`` (event ``source_still_down``) - :meth:`Outages.tick` says them;
- ``recovered: source X: connected again (5 failures since 09:45:08Z, down 2m13s)`` only when X
  itself is connected again, and has stayed so for STABLE_AFTER (event ``source_recovered``);
  an nsqlookupd when it answers again; an error without an address when any connection is up
  (and the line says so);
- an nsqd that nsqlookupd stopped listing (and that no --nsqd-tcp-address names) for
  ``forget_after`` ends its outage with its own line, never "recovered" (``source_unlisted``).

With ``watch`` (on by default when the lines go to a log, i.e. a daemon), :meth:`check` also says
every nsqd connection change, grouped per nsqd (``nsqd X: connection lost (200 topics)``,
``source X: connected again after 2m13s down (3 topics)``; events ``connected``,
``disconnected``).

The lines go to ``app.logger`` when set (with their event and fields, for --log-format json),
else to ``app.warn`` / ``app.info``. Thread-safe; the clocks are injectable for tests.
"""

from __future__ import annotations

import os
import threading
import time

#: seconds a connection must have lasted before its source counts as recovered
STABLE_AFTER = 1.0
#: first reminder after this many seconds down, then twice the interval each time, up to REMIND_MAX
REMIND_FIRST = 30.0
REMIND_MAX = 300.0
#: an nsqd no lookupd lists (and no --nsqd-tcp-address names) for this long is not waited for
FORGET_AFTER = 300.0

INFO, WARNING = 20, 30  # logging's levels (logging is not imported: `nsqcli pub` stays lean)


def remind_interval() -> tuple[float, float]:
    """(first, max) reminder intervals; NSQCLI_OUTAGE_REMIND=SECONDS (e.g. ``1`` or ``1s``)
    shrinks them (tests): the max becomes 10 x the first, at most REMIND_MAX."""
    raw = os.environ.get("NSQCLI_OUTAGE_REMIND", "").strip().rstrip("s")
    try:
        first = float(raw)
    except ValueError:
        return REMIND_FIRST, REMIND_MAX
    if first <= 0:
        return REMIND_FIRST, REMIND_MAX
    return first, max(first, min(REMIND_MAX, 10 * first))


def duration(seconds: float) -> str:
    """4.2s, 31s, 2m13s, 3h05m, 2d04h."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def hms(t: float) -> str:
    """A wall time as HH:MM:SSZ (UTC, as the log lines' timestamps)."""
    return time.strftime("%H:%M:%SZ", time.gmtime(t))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _kind(key) -> str:
    """The error kind a key counts as (the snapshot's "errors")."""
    if isinstance(key, tuple) and key and key[0] == "source":
        return "lookupd" if _is_lookupd(key[1]) else "source"
    if isinstance(key, tuple) and key:
        return str(key[0])
    return str(key)


def _is_lookupd(address) -> bool:
    return isinstance(address, str) and "://" in address


def _base(address: str) -> str:
    from ..client.http import base_url

    try:
        return base_url(address)
    except ValueError:
        return address


def _what(key) -> str:
    if isinstance(key, tuple) and key and key[0] == "source":
        if key[1] is None:
            return "source"
        return f"nsqlookupd {key[1]}" if _is_lookupd(key[1]) else f"source {key[1]}"
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


class _Outage:
    __slots__ = ("text", "count", "since_wall", "since", "last_wall", "next_remind", "interval", "unlisted_since")

    def __init__(self, text: str, wall: float, now: float, interval: float):
        self.text, self.count = text, 1
        self.since_wall, self.since = wall, now      # the first failure (wall clock, monotonic)
        self.last_wall = wall                         # the latest failure (wall clock)
        self.interval = interval
        self.next_remind = now + interval
        self.unlisted_since: float | None = None      # wall time nsqlookupd stopped listing it


class Outages:
    """See the module doc. ``app`` gives ``logger`` (or is a logging.Logger), or ``warn`` and
    ``info``; ``every`` is the first reminder interval (kept for the old callers' name)."""

    def __init__(self, app, every: float | None = None, clock=time.monotonic, wall=time.time,
                 remind_max: float | None = None, forget_after: float = FORGET_AFTER,
                 watch: bool | None = None, stable_after: float = STABLE_AFTER):
        first, cap = remind_interval()
        self.app = app
        self.every = every if every is not None else first
        self.remind_max = max(self.every, remind_max if remind_max is not None else cap)
        self.clock, self.wall = clock, wall
        self.forget_after = forget_after
        self.stable_after = stable_after
        self.watch = watch
        self._lock = threading.RLock()
        self._open: dict = {}           # key -> _Outage
        self._counts: dict[str, int] = {}
        self._conns: dict[str, set] = {}        # nsqd address -> labels (topics) connected last check
        self._down_since: dict[str, float] = {}  # nsqd address -> wall time its last connection was lost
        self._label_down: dict[tuple, float] = {}  # (address, label) lost while the nsqd stayed up

    # -- saying -------------------------------------------------------------------------------------
    def _logger(self):
        logger = getattr(self.app, "logger", None)
        if logger is not None:
            return logger
        if hasattr(self.app, "warning") and hasattr(self.app, "log"):  # a logging.Logger
            return self.app
        bound = getattr(getattr(self.app, "warn", None), "__self__", None)  # warn = logger.warning
        if hasattr(bound, "warning") and hasattr(bound, "log"):
            return bound
        return None

    def say(self, level: int, text: str, event: str, **fields) -> None:
        logger = self._logger()
        if logger is not None:
            logger.log(level, text, extra={"event": event, "fields": fields})
        elif level >= WARNING:
            self.app.warn(text)
        else:
            self.app.info(text)

    def _watching(self) -> bool:
        return self.watch if self.watch is not None else self._logger() is not None

    # -- failures -----------------------------------------------------------------------------------
    def failed(self, key, text: str, **fields) -> None:
        """One more failure of ``key``; said when new, changed, or due."""
        now, wall = self.clock(), self.wall()
        kind = _kind(key)
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            state = self._open.get(key)
            if state is None:
                self._open[key] = state = _Outage(text, wall, now, self.every)
                self._plan_next(state, now)
                line, event, extra = text, _event(key, "down"), {}
            else:
                state.count += 1
                state.last_wall = wall
                if text == state.text:
                    if now < state.next_remind:
                        return
                    self._plan_next(state, now)  # the reminder, with the count
                state.text = text  # a changed text is said at once; the reminders keep their pace
                line = f"{text} (x{state.count} since {hms(state.since_wall)}, down {duration(wall - state.since_wall)})"
                event, extra = _event(key, "still_down"), {"failures": state.count,
                                                           "down_seconds": round(wall - state.since_wall, 3)}
        self.say(WARNING, line, event, **_key_fields(key), error=text, **extra, **fields)

    def _plan_next(self, state: _Outage, now: float) -> None:
        state.next_remind = now + state.interval
        state.interval = min(self.remind_max, state.interval * 2)

    def ok(self, key, what: str | None = None, how: str | None = None, until: float | None = None) -> None:
        """``key`` works again: one ``recovered`` line if it was failing, else nothing.
        ``until``: the wall time it came back (a reconnect a moment ago), else now."""
        if key not in self._open:  # the common case, without the lock
            return
        with self._lock:
            state = self._open.pop(key, None)
        if state is not None:
            wall = self.wall() if until is None else max(state.since_wall, until)
            self.say(INFO, f"recovered: {what or _what(key)}{': ' + how if how else ''} "
                           f"({_plural(state.count, 'failure')} since {hms(state.since_wall)}, "
                           f"down {duration(wall - state.since_wall)})",
                     _event(key, "recovered"), **_key_fields(key), failures=state.count,
                     down_seconds=round(wall - state.since_wall, 3), how=how or "")

    def end(self, key, text: str, event: str, **fields) -> None:
        """End ``key``'s outage with its own line (not "recovered")."""
        with self._lock:
            state = self._open.pop(key, None)
        if state is not None:
            wall = self.wall()
            self.say(INFO, f"{text} ({_plural(state.count, 'failure')} since {hms(state.since_wall)}, "
                           f"down {duration(wall - state.since_wall)})", event, **_key_fields(key),
                     failures=state.count, down_seconds=round(wall - state.since_wall, 3), **fields)

    def tick(self, consumers=None, now: float | None = None) -> None:
        """Each turn of the wait loop: a reminder for each outage whose time has come, even when
        no new failure arrived (``consumers`` is accepted and ignored: :meth:`check` uses them)."""
        now = self.clock() if now is None else now
        due = []
        with self._lock:
            for key, state in self._open.items():
                if now >= state.next_remind:
                    self._plan_next(state, now)
                    due.append((key, state.text, state.count, state.since_wall, state.unlisted_since))
        wall = self.wall()
        for key, text, count, since, unlisted in due:
            down = "still down" if isinstance(key, tuple) and key and key[0] == "source" else "still failing"
            last = text[len("source: "):] if text.startswith("source: ") else text
            note = f"; nsqlookupd has not listed it for {duration(wall - unlisted)}" if unlisted else ""
            self.say(WARNING, f"{_what(key)} {down} after {duration(wall - since)} ({_plural(count, 'failure')} "
                              f"since {hms(since)}; last: {last}{note})",
                     _event(key, "still_down"), **_key_fields(key), failures=count,
                     down_seconds=round(wall - since, 3), error=text)

    remind = tick

    def say_still_failing(self) -> None:
        """At the end of a run: each outage that has not recovered, with its count."""
        wall = self.wall()
        with self._lock:
            still = [(k, s.text, s.count, s.since_wall) for k, s in self._open.items()]
        for key, text, n, since in still:
            if n > 1:
                self.say(WARNING, f"{text} (x{n} since {hms(since)}, down {duration(wall - since)}, not recovered)",
                         _event(key, "still_down"), **_key_fields(key), failures=n,
                         down_seconds=round(wall - since, 3), error=text)

    def failing(self) -> list:
        with self._lock:
            return list(self._open)

    def down_since(self, key) -> float | None:
        """Wall time of the first failure of ``key``'s open outage (None when not failing)."""
        with self._lock:
            state = self._open.get(key)
            return None if state is None else state.since_wall

    def counts(self) -> dict[str, int]:
        """Failures said or counted since the start, by kind (source, lookupd, destination, ...)."""
        with self._lock:
            return dict(self._counts)

    # -- sources: connections, recoveries -----------------------------------------------------------
    def check(self, consumers) -> None:
        """Each turn of the wait loop, with the run's consumers: the connection changes (when
        watching), the sources that are back, the nsqd no lookupd lists any more, the reminders."""
        consumers = [c for c in consumers if not getattr(c, "_stopping", False)]
        wall = self.wall()
        if self._watching():
            self._diff(consumers, wall)
        failing = [k for k in self.failing() if isinstance(k, tuple) and k and k[0] == "source"]
        if failing:
            self._recoveries(failing, consumers, wall)
        self.tick()

    def _diff(self, consumers: list, wall: float) -> None:
        now: dict[str, set] = {}
        labels = set()
        for c in consumers:
            label = getattr(c, "topic", "?")
            labels.add(label)
            for address in c.connections:
                now.setdefault(address, set()).add(label)
        before = self._conns
        self._conns = now
        for address in sorted(set(now) | set(before)):
            was, got = before.get(address, set()) & labels, now.get(address, set())
            open_ = ("source", address) in self._open
            if got and address not in before:
                down = self._down_since.pop(address, None)
                for label in got:
                    self._label_down.pop((address, label), None)
                if open_:
                    continue  # "recovered" is said once it stays up (STABLE_AFTER)
                if down is not None:
                    self.say(INFO, f"source {address}: connected again after {duration(wall - down)} down "
                                   f"({_topics(got)})", "connected", nsqd=address, topics=len(got),
                             down_seconds=round(wall - down, 3))
                else:
                    self.say(INFO, f"nsqd {address} connected ({_topics(got)})", "connected", nsqd=address,
                             topics=len(got))
            elif was and not got:
                self._down_since[address] = wall
                self.say(INFO if open_ else WARNING, f"nsqd {address}: connection lost ({_topics(was)})",
                         "disconnected", nsqd=address, topics=len(was))
            elif got:
                lost = was - got
                if lost:
                    for label in lost:
                        self._label_down[(address, label)] = wall
                    self.say(INFO if open_ else WARNING,
                             f"nsqd {address}: connection lost ({_topics(lost)}; {_plural(len(got), 'topic')} "
                             "still connected)", "disconnected", nsqd=address, topics=len(lost))
                back = [(label, self._label_down.pop((address, label))) for label in sorted(got - was)
                        if (address, label) in self._label_down]
                if back and not open_:
                    longest = max(wall - t for _, t in back)
                    self.say(INFO, f"source {address}: connected again after {duration(longest)} down "
                                   f"({_topics({label for label, _ in back})})", "connected", nsqd=address,
                             topics=len(back), down_seconds=round(longest, 3))
        if len(self._label_down) > 10_000:  # topics that never came back: bounded memory
            self._label_down.clear()

    def _recoveries(self, failing: list, consumers: list, wall: float) -> None:
        stats = [(c, s) for c in consumers for s in c.stats()]
        stable = {s.address for _, s in stats
                  if s.connected_at is not None and wall - s.connected_at >= self.stable_after}
        for key in failing:
            address = key[1]
            if address is None:
                if stable:
                    self.ok(key, "source", f"a connection to {sorted(stable)[0]} is up (the failing address "
                                           "is not known)")
            elif _is_lookupd(address):
                base = _base(address)
                known = [c for c in consumers if base in {_base(a) for a in getattr(c, "lookupd_addresses", ())}]
                last = self._last_failure(key)
                answered = max((getattr(c.discovery, "answered", {}).get(base, 0.0) for c in known
                                if hasattr(c, "discovery")), default=0.0)
                if known and last is not None and answered > last:
                    self.ok(key, f"nsqlookupd {address}", "it answers again")
                elif not known and stable:
                    self.ok(key, f"nsqlookupd {address}", f"nothing asks it now; a connection to "
                                                          f"{sorted(stable)[0]} is up")
            elif address in stable:
                back = min(s.connected_at for _, s in stats if s.address == address and s.connected_at is not None)
                self.ok(key, f"source {address}", "connected again", until=back)
            else:
                self._unlisted(key, address, consumers, wall)

    def _last_failure(self, key) -> float | None:
        with self._lock:
            state = self._open.get(key)
            return None if state is None else state.last_wall

    def _unlisted(self, key, address: str, consumers: list, wall: float) -> None:
        """An nsqd that is down: still wanted (named by --nsqd-tcp-address, listed by the
        lookupds, or nobody can tell), or not listed any more - for forget_after, then said."""
        wanted = False
        for c in consumers:
            if address in getattr(c, "nsqd_addresses", ()) or address in c.connections:
                wanted = True
                break
            listed = getattr(getattr(c, "discovery", None), "listed", None)
            if getattr(c, "lookupd_addresses", None) and (listed is None or address in listed):
                wanted = True
                break
        with self._lock:
            state = self._open.get(key)
            if state is None:
                return
            if wanted:
                state.unlisted_since = None
                return
            if state.unlisted_since is None:
                state.unlisted_since = wall
            if wall - state.unlisted_since < self.forget_after:
                return
            since, first = state.unlisted_since, state.since_wall
        self.end(key, f"source {address}: no longer listed by nsqlookupd for {duration(wall - since)}: not "
                      "waited for any more (a line says so if it connects again)", "source_unlisted")
        self._down_since.setdefault(address, first)


def _event(key, what: str) -> str:
    kind = "source" if isinstance(key, tuple) and key and key[0] == "source" else _kind(key)
    return f"{kind}_{what}"


def _key_fields(key) -> dict:
    if isinstance(key, tuple) and key and key[0] == "source":
        return {"source": key[1], "kind": "lookupd" if _is_lookupd(key[1]) else "nsqd"}
    return {"kind": _kind(key)}


def _topics(labels: set) -> str:
    return f"topic {next(iter(labels))}" if len(labels) == 1 else f"{len(labels)} topics"


def source_error(outages: Outages, err) -> None:
    """A consumer's error (its nsqd lost or refusing, a lookupd failing): said when it starts,
    counted while it lasts; :func:`sources_recovered` says when that source is back."""
    address = getattr(err, "address", None) or getattr(err, "endpoint", None)
    outages.failed(("source", address), f"source: {err}")


def sources_recovered(outages: Outages, consumers) -> None:
    """Called each turn of a wait loop: connection changes, recoveries, reminders
    (:meth:`Outages.check`)."""
    outages.check(list(consumers))
