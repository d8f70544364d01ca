"""Load generation for ``nsqcli bench``: publisher and consumer workers (threads or
processes) and latency recording. Publishers put a send timestamp (8 bytes, ns) at the start
of every body; consumers measure end-to-end latency from it. A worker's result goes to the
``out`` queue as (kind, index, messages, bytes, seconds, latencies)."""

from __future__ import annotations

import struct
import threading
import time

STAMP = struct.Struct(">q")
SAMPLE = 200_000  # latencies kept per consumer for percentiles (every k-th when more)


def guarded(target):
    """A client's failure becomes one result line ("error", idx, text), never a traceback."""
    def run(idx, *args):
        out = args[-1] if target is publisher else args[-3]
        try:
            target(idx, *args)
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which exits 1
            out.put(("error", idx, str(e) or type(e).__name__, 0, 0.0, []))
    return run


def publisher(idx, addresses, cfg, topic, size, count, duration, batch, progress, stop, out):
    from .client.producer import Producer

    pad = b"x" * max(0, size - STAMP.size)
    pack, now = STAMP.pack, time.time_ns

    def bodies():
        """A list of bodies per batch (publish_iter takes a list whole), stamped when the batch
        is made: a message's latency counts from when its batch was built, not when the
        generator happened to yield it (per-message stamping cost 0.79x bench_writer)."""
        k, step = 0, max(1, batch)
        while (not count or k < count) and not stop.is_set():
            n = step if not count else min(step, count - k)
            yield [pack(now()) + pad] * n
            k += n

    p = Producer(addresses, cfg)
    t0 = time.perf_counter()
    end = t0 + duration if duration else None
    sent = 0
    try:
        if end is not None:
            threading.Thread(target=lambda: (time.sleep(duration), stop.set()), daemon=True).start()
        last = [0]

        def on_progress(n):
            with progress.get_lock():
                progress.value += n - last[0]
            last[0] = n

        r = p.publish_iter(topic, bodies(), batch_size=batch, window=8, on_progress=on_progress)
        sent = r.published if hasattr(r, "published") else last[0]
    finally:
        p.close()
    out.put(("pub", idx, sent or last[0], (sent or last[0]) * size, time.perf_counter() - t0, []))


def consumer(idx, addresses, lookupds, cfg, topic, channel, size, total, duration, received, stop, out,
              ready, from_first: bool):
    from array import array

    from .client.consumer import Consumer

    lat = array("q")
    mine = [0]
    every = [1]
    lock = threading.Lock()
    done = threading.Event()
    unpack, now = STAMP.unpack_from, time.time_ns

    first = [0.0]
    last_at = [0.0]

    def handle(msgs):
        t = now()
        with lock:
            last_at[0] = time.perf_counter()
            if not first[0]:
                first[0] = last_at[0]
            for m in msgs:
                mine[0] += 1
                if mine[0] % every[0] == 0:
                    lat.append(t - unpack(m.body)[0])
            if len(lat) >= SAMPLE * 2:  # keep every other one from now on
                del lat[::2]
                every[0] *= 2
        with received.get_lock():
            received.value += len(msgs)
            if total and received.value >= total:
                stop.set()

    c = Consumer(topic, channel, batch_handler=handle, config=cfg, nsqd_tcp_addresses=addresses,
                 lookupd_http_addresses=lookupds)
    t0 = time.perf_counter()
    c.start()
    with ready.get_lock():
        ready.value += 1
    end = t0 + duration if duration else None
    while not stop.is_set() and not done.is_set():
        if end is not None and time.perf_counter() >= end:
            break
        time.sleep(0.01)
    # sub: from start (connect included) to the last message; pubsub: from the first message
    elapsed = (last_at[0] or time.perf_counter()) - (first[0] if from_first and first[0] else t0)
    c.stop(timeout=10)
    out.put(("sub", idx, mine[0], mine[0] * size, elapsed, list(lat)))


def percentiles(values: list[int]) -> dict:
    if not values:
        return {}
    s = sorted(values)

    def q(p):
        return s[min(len(s) - 1, int(p * len(s)))] / 1e6

    return {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "p99.9": q(0.999), "max": s[-1] / 1e6}
