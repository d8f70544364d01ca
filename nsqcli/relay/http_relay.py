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

    # -- the consumer's handler threads --------------------------------------------------------
    def __call__(self, msgs: list) -> None:
        for m in msgs:
            if self.done.is_set():
                m.requeue(delay=0, backoff=False)
                continue
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
            self.outages.failed("delivery", f"{e} (requeued; the consumer backs off)")
            delay = e.retry_after if e.retry_after is not None else min(900.0, self.requeue_delay * m.attempts)
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
        consumer.stop(timeout=left(15))

    def status(self, elapsed: float) -> str:
        return (f"delivered {self.delivered:,}, failed attempts {self.failed:,} (requeued), sampled out "
                f"{self.sampled_out:,}, {self.delivered / max(elapsed, 1e-9):,.0f} msg/s")
