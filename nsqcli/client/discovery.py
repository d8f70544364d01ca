"""Where a Consumer's nsqd come from. Its timer step runs on the shared timer thread
(nsqcli.client.workers.TIMERS) and never blocks: connection attempts run on the I/O loops,
lookupd polls on a shared BLOCKING thread.

- Direct addresses (``--nsqd-tcp-address``): reconnected after a loss with exponential backoff
  and jitter (reconnect_min_delay x 2^n, 50-100 %, up to reconnect_max_delay: 4 s by default,
  so a node that is back is read within seconds).
- nsqlookupd: every lookupd is asked (at once) every lookupd_poll_interval (jittered); each producer not
  connected yet is dialed. When a lookupd-found nsqd is lost, the lookupds are asked again after
  ~1 s, 2 s, 4 s, 4 s ... (the same backoff, for LOST_WINDOW or one poll interval, whichever is
  longer): not at once - an immediate SUB would re-create a topic that was just deleted - and
  not only at the next regular poll, a minute away.

It knows its consumer only through what it is given (go-nsq's lookupd loop calls
ConnectToNSQD): ``connect(address, direct, report=True, deadline=None)`` starts an attempt
(returns an error only when it could not even start), ``connected()`` the addresses connected
now, ``stopping()`` whether the consumer is stopping, ``report(err)`` its error callback.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection, Sequence

from ..errors import NSQError
from .config import Config
from . import workers
from .http import base_url, lookup_all

#: seconds after the loss of a lookupd-found nsqd during which lookupd is re-polled quickly
LOST_WINDOW = 300.0
#: 2**n stays a float-sized number however many attempts failed
MAX_EXPONENT = 30


class Discovery:
    def __init__(self, topic: str, lookupds: Sequence[str], direct: Sequence[str], config: Config, *,
                 lock: threading.RLock, rng: random.Random, connect: Callable, connected: Callable[[], Collection[str]],
                 stopping: Callable[[], bool], report: Callable[[BaseException], None]):
        self.topic = topic
        self.lookupds = lookupds  # nsqlookupd HTTP addresses
        self.direct = direct      # the nsqd TCP addresses given directly (reconnected on their own)
        self.config = config
        self.rng = rng
        self.lock = lock  # the consumer's lock: one lock for its connection state
        self._connect = connect
        self._connected = connected
        self._stopping = stopping
        self._report = report
        self.polling = False  # a lookupd poll is running on a BLOCKING thread
        self.reconnect: dict[str, tuple[int, float]] = {}  # direct address -> (failures, next try)
        self.lost: dict[str, float] = {}  # lookupd-found address -> when it was lost
        self.fast_polls = 0               # consecutive quick re-polls since a loss
        self.next_poll = 0.0
        # what the last polls said, for the outage log (nsqcli.daemon.outages): the topic's
        # producers when every lookupd answered (None until then), each lookupd's last answer
        self.listed: set[str] | None = None
        self.answered: dict[str, float] = {}  # lookupd base URL -> time.time() it last answered

    def start(self) -> None:
        workers.TIMERS.add(self, self._tick)

    def join(self, timeout: float) -> None:
        workers.TIMERS.remove(self)

    def _wake(self) -> None:
        workers.TIMERS.wake(self)

    # -- events from the consumer ---------------------------------------------------------------
    def connected(self, address: str) -> None:
        """(with the lock held)"""
        self.reconnect.pop(address, None)
        self.lost.pop(address, None)

    def retry_delay(self, failures: int, cap: float | None = None) -> float:
        """reconnect_min_delay x 2^failures, capped at reconnect_max_delay (and ``cap``), with
        50-100 % jitter."""
        cfg = self.config
        delay = min(cfg.reconnect_max_delay, cfg.reconnect_min_delay * 2 ** min(failures, MAX_EXPONENT))
        if cap is not None:
            delay = min(delay, cap)
        return delay * (0.5 + self.rng.random() * 0.5)

    def schedule_reconnect(self, address: str) -> None:
        """A direct nsqd is gone (or refused us): try again after retry_delay."""
        with self.lock:
            failures, _ = self.reconnect.get(address, (0, 0.0))
            self.reconnect[address] = (failures + 1, time.monotonic() + self.retry_delay(failures))
        self._wake()

    def lost_lookupd_producer(self, address: str) -> None:
        """A lookupd-found nsqd went away: look for it again soon (see the module doc)."""
        delay = self.retry_delay(self.fast_polls, self.config.lookupd_poll_interval)
        with self.lock:
            self.lost[address] = time.monotonic()
            self.next_poll = min(self.next_poll, time.monotonic() + delay)
        self._wake()

    # -- the timer step (never blocks: polls run on a BLOCKING thread) ------------------------------
    def _tick(self, now: float) -> float:
        if self._stopping():
            return 5.0
        with self.lock:
            due = [a for a, (_, when) in self.reconnect.items() if now >= when]
        for address in due:
            if not self._stopping():
                self._connect(address, direct=True)  # starts the attempt, returns at once
        if self.lookupds and now >= self.next_poll and not self.polling:
            self.polling = True
            workers.BLOCKING.submit(self._poll)
        return self._timeout()

    def _poll(self) -> None:
        try:
            if not self._stopping():
                self.poll_lookupd(report=True)
        except Exception as e:  # report, keep going
            self._report(e)
        finally:
            self.polling = False
            self._wake()

    def _timeout(self) -> float:
        now = time.monotonic()
        t = 5.0
        if self.lookupds and not self.polling:
            t = min(t, self.next_poll - now)
        with self.lock:
            whens = [when for _, when in self.reconnect.values()]
        for when in whens:
            t = min(t, when - now)
        return max(0.005, t)

    def poll_lookupd(self, report: bool, deadline: float | None = None) -> list[NSQError]:
        """Ask every lookupd; connect to the producers not connected yet. Returns the errors
        (reported through the consumer's on_error too when ``report``)."""
        timeout = self.config.lookupd_poll_timeout
        if deadline is not None:
            timeout = max(0.001, min(timeout, deadline - time.monotonic()))
        producers, errors = lookup_all(self.lookupds, self.topic, timeout, cancel=self._stopping)
        if self._stopping():  # interrupted meanwhile (a signal during the start): nothing to say or dial
            return []
        self._note_answers(producers, errors)
        if report:
            for e in errors:
                self._report(e)
        connected = self._connected()
        for p in producers:
            address = p.tcp_address
            if address not in connected and address not in self.reconnect:
                err = self._connect(address, direct=address in self.direct, report=report, deadline=deadline)
                if err is not None and not report:
                    errors.append(err)
        self.plan_next_poll()
        return list(errors)

    def _note_answers(self, producers: list, errors: list) -> None:
        from . import limits

        for p in producers:  # nsqd's HTTP address as nsqlookupd knows it (limits, the daemons' lag)
            if p.http_address:
                limits.note_http(p.tcp_address, p.http_address)
        failed = {_base(getattr(e, "endpoint", "")) for e in errors}
        now = time.time()
        for address in self.lookupds:
            if _base(address) not in failed:
                self.answered[_base(address)] = now
        if not errors:
            self.listed = {p.tcp_address for p in producers}

    def plan_next_poll(self) -> None:
        """Regular polls every lookupd_poll_interval (jittered); quick ones with backoff while a
        lost nsqd has not come back (for LOST_WINDOW or one poll interval after the loss); every
        5 s at most while no nsqd carries the topic yet."""
        cfg = self.config
        now = time.monotonic()
        nxt = now + cfg.lookupd_poll_interval * (1 + cfg.lookupd_poll_jitter * (self.rng.random() - 0.5))
        window = max(LOST_WINDOW, cfg.lookupd_poll_interval)
        with self.lock:
            connected = self._connected()
            for address, lost_at in list(self.lost.items()):
                if address in connected or now - lost_at > window:
                    del self.lost[address]
            if self.lost:
                self.fast_polls += 1
                nxt = min(nxt, now + self.retry_delay(self.fast_polls, cfg.lookupd_poll_interval))
            else:
                self.fast_polls = 0
            if not connected:  # nothing to read yet: find a new topic's first nsqd soon
                nxt = min(nxt, now + min(cfg.lookupd_poll_interval, 5.0))
            self.next_poll = nxt


def _base(address: str) -> str:
    """A lookupd address as its errors name it (http://host:port), whatever the path."""
    try:
        return base_url(address)
    except ValueError:
        return address
