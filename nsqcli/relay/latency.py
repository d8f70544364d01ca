"""Delivery latency of the relays (to-nsq, to-http): a histogram the metrics read."""

from __future__ import annotations

import threading

#: upper bounds (seconds) of the delivery latency buckets
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """Counts of observations per bucket (Prometheus' convention when read: cumulative)."""

    def __init__(self, bounds=BUCKETS):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = 0
        for i, b in enumerate(self.bounds):  # noqa: B007 - a dozen bounds: a bisect is not faster
            if seconds <= b:
                break
        else:
            i = len(self.bounds)
        with self._lock:
            self.counts[i] += 1
            self.sum += seconds

    def snapshot(self) -> dict:
        with self._lock:
            counts, total = list(self.counts), self.sum
        buckets, running = [], 0
        for b, n in zip(list(self.bounds) + ["+Inf"], counts):
            running += n
            buckets.append([b, running])
        return {"buckets": buckets, "sum": round(total, 6), "count": running}
