"""The threads consumers share (nsqcli.client.workers): the timer thread, the blocking-call
threads and handler pools - what they run, when, and that they end when unused."""

from __future__ import annotations

import threading
import time

from tests.support.helpers import wait_for

from nsqcli.client.workers import Blocking, HandlerPool, Timers


def test_each_step_runs_when_it_asked_and_a_wake_runs_it_at_once():
    timers = Timers("test-timers")
    runs = {"fast": [], "slow": []}
    timers.add("fast", lambda now: runs["fast"].append(now) or 0.02)
    timers.add("slow", lambda now: runs["slow"].append(now) or 3600.0)
    try:
        wait_for(lambda: len(runs["fast"]) >= 10, timeout=5, what="the fast step, again and again")
        assert len(runs["slow"]) == 1  # asked for an hour
        timers.wake("slow")
        wait_for(lambda: len(runs["slow"]) == 2, timeout=2, what="the woken step")
    finally:
        timers.remove("fast")
        timers.remove("slow")
    wait_for(lambda: timers._thread is None, timeout=2, what="the thread ends with its last step")


def test_a_wake_during_a_step_runs_it_again_and_remove_waits_for_a_running_step():
    timers = Timers("test-timers")
    inside, release, runs = threading.Event(), threading.Event(), []

    def step(now):
        runs.append(now)
        if len(runs) == 1:
            inside.set()
            release.wait(5)
        return 3600.0

    timers.add("k", step)
    assert inside.wait(5)
    timers.wake("k")  # while it runs: it runs again right after
    release.set()
    wait_for(lambda: len(runs) == 2, timeout=2, what="the second run")
    inside.clear()
    timers.remove("k")
    n = len(runs)
    time.sleep(0.1)
    assert len(runs) == n


def test_thousands_of_steps_each_run_on_time():
    """3,000 keys (a to-file over 1,500 topics: a consumer and its discovery each) on one
    thread: every one runs again within its interval and a little, not after a scan of all."""
    timers = Timers("test-timers")
    count = [0] * 3000
    for i in range(3000):
        timers.add(i, lambda now, i=i: count.__setitem__(i, count[i] + 1) or 0.2)
    try:
        wait_for(lambda: min(count) >= 3, timeout=10, what="every step run 3 times")
    finally:
        for i in range(3000):
            timers.remove(i)
    assert max(count) <= 3 + 10  # none ran far more often than it asked


def test_blocking_threads_run_everything_and_end_when_idle():
    pool = Blocking(size=2, name="test-blocking", idle=0.2)
    done = []
    for i in range(20):
        pool.submit(lambda i=i: done.append(i))
    wait_for(lambda: sorted(done) == list(range(20)), timeout=5, what="every call")
    assert pool._threads <= 2
    wait_for(lambda: pool._threads == 0, timeout=3, what="idle threads ending")


def test_a_handler_pool_runs_while_used_and_stops_with_its_last_user():
    pool = HandlerPool(2, name="test-handlers")
    handled = []

    class Owner:
        def handle(self, handle, msgs):
            handled.append((handle, msgs))

    pool.acquire()
    pool.acquire()
    pool.put((Owner(), "h", [1, 2]))
    wait_for(lambda: handled == [("h", [1, 2])], timeout=2, what="the batch handled")
    pool.release()
    assert all(t.is_alive() for t in pool._threads)  # one user left
    pool.release()
    assert not pool._threads
    assert not [t for t in threading.enumerate() if t.name.startswith("test-handlers")]


def test_an_ordered_pool_handles_one_consumers_batches_in_order_and_others_beside():
    """to-file's pool: batches of one consumer never overtake each other (two threads took
    batch k and k+1 and wrote k+1 first: an archive out of nsqd's order), other consumers run
    beside it."""
    import threading
    import time as _time

    from nsqcli.client.workers import HandlerPool

    seen: dict = {"a": [], "b": []}
    active: dict = {"a": 0, "b": 0}
    overlap = []
    lock = threading.Lock()

    class FakeConsumer:
        def __init__(self, name):
            self.name = name

        def handle(self, handle, msgs):
            with lock:
                active[self.name] += 1
                overlap.append(active[self.name])
            _time.sleep(0.001 if handle % 3 else 0.004)  # uneven: a later batch would finish first
            with lock:
                seen[self.name].append(handle)
                active[self.name] -= 1

    pool = HandlerPool(4, ordered=True)
    pool.acquire()
    a, b = FakeConsumer("a"), FakeConsumer("b")
    for i in range(60):
        pool.put((a, i, []))
        pool.put((b, i, []))
    deadline = _time.monotonic() + 10
    while (len(seen["a"]) < 60 or len(seen["b"]) < 60) and _time.monotonic() < deadline:
        _time.sleep(0.01)
    pool.release()
    assert seen["a"] == list(range(60)) and seen["b"] == list(range(60))
    assert max(overlap) == 1  # never two batches of one consumer at once


def test_an_ordered_pool_keeps_the_order_when_the_thread_with_the_first_batch_is_late():
    """The thread that got a consumer's first batch claimed the consumer only afterwards: on a
    busy machine it was descheduled in between, another thread got and claimed the next batch,
    and the first one was handled after the rest (an archive's msg-0000000 written after
    msg-0000199, with no redelivery: nsqd's requeue and timeout counts were 0). The order is now
    fixed when the batches are put; here the late thread is played by a queue whose first get()
    returns 0.2 s late."""
    import threading
    import time as _time

    from nsqcli.client.workers import HandlerPool

    seen: list = []

    class Owner:
        def handle(self, handle, msgs):
            seen.append(handle)

    pool = HandlerPool(2, ordered=True)
    real, late = pool.queue, threading.Event()

    class LateFirstGet:
        def put(self, item):
            real.put(item)

        def get(self):
            item = real.get()
            if item is not None and not late.is_set():
                late.set()
                _time.sleep(0.2)  # this thread descheduled right after it got the first batch
            return item

    pool.queue = LateFirstGet()
    owner = Owner()
    pool.acquire()
    try:
        for i in range(10):
            pool.put((owner, i, []))
        deadline = _time.monotonic() + 5
        while len(seen) < 10 and _time.monotonic() < deadline:
            _time.sleep(0.01)
    finally:
        pool.release()
    assert seen == list(range(10))
