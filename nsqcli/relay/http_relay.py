"""to-http's delivery policy: which messages are delivered, FIN after the endpoint's 2xx (200 to
a GET), REQ with backoff otherwise (after Retry-After when the endpoint says so), -n counted
across requests in flight, and the stop that answers every message it holds.

:class:`HttpRelay` is the consumer's batch handler; the requests themselves are
:class:`nsqcli.relay.http_delivery.Deliverer`'s."""

from __future__ import annotations

import random
import threading
import time

from .latency import Histogram


class HttpRelay:
    """``outages``: where failures are said (``failed(key, text)``, ``ok(key, what)``)."""

    def __init__(self, deliverer, *, count: int, sample: float, requeue_delay: float, outages,
                 done: threading.Event, rng: random.Random | None = None):
        self.deliverer = deliverer
        self.count = count
        self.sample = sample
        self.requeue_delay = requeue_delay
        self.outages = outages
        self.done = done
        self.rng = rng or random.Random()
        self.lock = threading.Lock()
        self.delivered = self.failed = self.sampled_out = 0
        self.sending = 0  # requests started and not finished (-n counts them as taken)
        self.last = time.monotonic()
        self.latency = Histogram()
        # --max-attempts N: after the Nth failed attempt a message is dead-lettered (``dead``: a
        # nsqcli.relay.dead_letter.DeadLetters) or else FINed, said (``warn``)
        self.max_attempts, self.dead, self.warn = 0, None, (lambda text: None)
        self.dead_lettered = self.given_up = 0
        self.accept = None  # --grep/--where (nsqcli.filters.Filter): the others are FINed undelivered, counted
        self.filtered = 0

    # -- the consumer's handler threads --------------------------------------------------------
    def __call__(self, msgs: list) -> None:
        for m in msgs:
            if self.done.is_set():
                m.requeue(delay=0, backoff=False)
                continue
            if self.accept is not None and not self.accept(m):
                with self.lock:
                    self.filtered += 1
                continue  # FINed by the batch (auto-response)
            if self.sample < 1.0 and self.rng.random() >= self.sample:
                with self.lock:
                    self.sampled_out += 1
                continue  # FINed by the batch (auto-response)
            m.auto_response = False  # answered when the deliverer is done with it
            started = time.monotonic()
            try:
                self.deliverer.submit(m.body, lambda e, m=m, t=started: self._answered(m, e, t),
                                      lambda m=m: self._may_start(m), m)
            except RuntimeError:  # closed: stopping
                m.requeue(delay=0, backoff=False)

    def _claim(self) -> bool:
        """-n N: a request may start only while delivered + sending < N (with 100 requests in
        flight, the ones already started when the Nth succeeded would deliver N + 28)."""
        with self.lock:
            if self.count and self.delivered + self.sending >= self.count:
                return False
            self.sending += 1
            return True

    def _may_start(self, m) -> bool:
        if self.done.is_set() or not self._claim():  # stopping, or -n is taken: it goes back at once
            m.requeue(delay=0, backoff=False)
            return False
        return True

    # -- the deliverer's I/O thread ---------------------------------------------------------------
    def _answered(self, m, e, started: float) -> None:
        """The deliverer's answer for ``m``: FIN, or REQ with backoff."""
        with self.lock:
            self.sending -= 1
        if e is not None and e.abandoned:  # given up at the deadline: not the endpoint's fault
            m.requeue(delay=0, backoff=False)
            return
        if e is not None:
            with self.lock:
                self.failed += 1
            delay = e.retry_after if e.retry_after is not None else min(900.0, self.requeue_delay * m.attempts)
            if self.max_attempts and m.attempts >= self.max_attempts:
                self._give_up(m, f"{e} (attempt {m.attempts} of --max-attempts {self.max_attempts})", delay)
                return
            self.outages.failed("delivery", f"{e} (requeued; the consumer backs off)")
            m.requeue(delay=delay, backoff=True)
            return
        m.finish()
        self.outages.ok("delivery", "delivery")
        now = time.monotonic()
        self.latency.observe(now - started)
        with self.lock:
            self.delivered += 1
            self.last = now
            if self.count and self.delivered >= self.count:
                self.done.set()

    def _give_up(self, m, error: str, delay: float) -> None:
        """The last attempt failed: to the dead-letter topic (FIN after its OK), or FIN, said."""
        if self.dead is not None:
            def counted(ok: bool) -> None:
                if ok:
                    with self.lock:
                        self.dead_lettered += 1

            self.dead.submit(m, error, delay, counted)
            return
        m.finish()
        with self.lock:
            self.given_up += 1
        self.warn(f"gave up on message {m.id.decode('ascii', 'replace')} after {m.attempts} attempts: {error}; "
                  "FINed, NOT delivered")

    # -- the stop ----------------------------------------------------------------------------------
    def stop(self, consumer, end: float | None, http_budget: float) -> None:
        """No more messages (CLS; what still arrives goes back at once), every request in flight
        answered (FIN or REQ) before the consumer closes, the ones not started given back at
        once. With ``end`` (past --timeout) all of it by then: requests still in flight are
        given up (REQ at once: at least once)."""

        def left(cap: float) -> float:
            return cap if end is None else max(0.01, min(cap, end - time.monotonic()))

        consumer.drain(timeout=left(5))
        d = self.deliverer
        handed_back = d.close(timeout=left(http_budget) if end is None else max(0.0, end - 0.15 - time.monotonic()))
        if not d.finished:
            d.abort("given up: --timeout passed" if end is not None else "given up while stopping")
            handed_back += d.close(timeout=left(1))
        for m in handed_back:
            m.requeue(delay=0, backoff=False)
        if self.dead is not None:  # the dead letters published (FIN) before the connections close
            self.dead.close(left(10))
        consumer.stop(timeout=left(15))

    def status(self, elapsed: float) -> str:
        gave = (f", dead-lettered {self.dead_lettered:,}" if self.dead is not None else
                f", given up {self.given_up:,}" if self.max_attempts else "")
        return (f"delivered {self.delivered:,}, failed attempts {self.failed:,} (requeued){gave}, sampled out "
                f"{self.sampled_out:,}{f', left out by --grep/--where {self.filtered:,}' if self.accept else ''}, "
                f"{self.delivered / max(elapsed, 1e-9):,.0f} msg/s")
