"""to-nsq's copier: the batch handler that filters/rewrites bodies and MPUBs them to the
destination, FINing a batch only after the destination acknowledged every message."""

from __future__ import annotations

import json
import re
import threading
import time


class DestinationError(Exception):
    """A batch the destination did not acknowledge in full (the consumer requeues it)."""

    def __init__(self, cause: BaseException | str):
        super().__init__(str(cause))
        self.cause = cause


_TOO_BIG = re.compile(r"too big (\d+) > (\d+)")


class Copier:
    """The batch handler: filter/rewrite bodies, MPUB them to the destination, return (FIN) only
    after the destination acknowledged every one; raise DestinationError (REQ with backoff) when
    it did not. A message over the destination's message limit is taken out of its batch and
    requeued alone (no backoff), and given up (FINed, said) after ``max_attempts``."""

    def __init__(self, producer, topic: str | None, mode: str, require: tuple | None, whitelist: tuple,
                 pacer, count: int, done: threading.Event, *, max_msg_size: int = 1024 * 1024,
                 max_attempts: int = 5, requeue_delay: float = 90.0, outages=None, warn=None):
        self.producer, self.topic, self.mode = producer, topic, mode
        self.require, self.whitelist, self.pacer = require, whitelist, pacer
        self.count, self.done = count, done
        self.max_msg_size, self.max_attempts, self.requeue_delay = max_msg_size, max_attempts, requeue_delay
        self.outages, self.warn = outages, warn or (lambda text: None)
        self.lock = threading.Lock()
        self.pace_lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.active = 0
        self.copied = self.filtered = self.failed_batches = self.too_big = self.given_up = 0
        self.last = time.monotonic()

    def _body(self, body: bytes) -> bytes | None:
        """The body to publish, or None when a JSON filter leaves it out."""
        if not self.require and not self.whitelist:
            return body
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        if self.require:
            field, value = self.require
            if field not in doc or (value is not None and str(doc[field]) != value):
                return None
        if self.whitelist:
            doc = {k: doc[k] for k in self.whitelist if k in doc}
            return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        return body

    def __call__(self, msgs: list) -> None:
        with self.lock:
            self.active += 1
        try:
            self._copy(msgs)
        finally:
            with self.lock:
                self.active -= 1
                self.idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Until no batch is being published (the summary must count the last one)."""
        with self.lock:
            return self.idle.wait_for(lambda: self.active == 0, timeout)

    def _copy(self, msgs: list) -> None:
        if self.done.is_set():  # stopping: give them back at once
            for m in msgs:
                m.requeue(delay=0, backoff=False)
            return
        with self.lock:
            room = self.count - self.copied if self.count else len(msgs)
        if room < len(msgs):
            for m in msgs[max(room, 0):]:
                m.requeue(delay=0, backoff=False)
            msgs = msgs[:max(room, 0)]
            if not msgs:
                return
        by_topic: dict[str, list[bytes]] = {}
        skipped = big = 0
        for m in msgs:
            body = self._body(m.body)
            if body is None:
                skipped += 1
            elif len(body) > self.max_msg_size:
                big += 1
                self._too_big(m, len(body))
            else:
                by_topic.setdefault(self.topic or m.topic, []).append(body)
        if self.pacer is not None:
            with self.pace_lock:  # one clock for every handler thread
                self.pacer.wait(len(msgs) - skipped - big)
        if self.mode == "round-robin" and by_topic:
            self.producer.rotate()
        for topic, bodies in by_topic.items():
            self._publish(topic, bodies)
        with self.lock:
            self.copied += len(msgs) - skipped - big
            self.filtered += skipped
            if by_topic:
                self.last = time.monotonic()
            if self.count and self.copied >= self.count:
                self.done.set()

    def _publish(self, topic: str, bodies: list[bytes]) -> None:
        """MPUB; returns only when the destination acknowledged every body."""
        try:
            result = self.producer.multi_publish(topic, bodies)
        except Exception as e:
            self._learn_limit(e)
            with self.lock:
                self.failed_batches += 1
            raise DestinationError(e) from e  # the consumer requeues the batch with backoff
        published = getattr(result, "published", None)
        if published != len(bodies):
            with self.lock:
                self.failed_batches += 1
            raise DestinationError(f"the destination acknowledged {published} of {len(bodies)} messages "
                                   f"for topic {topic}")
        if self.outages is not None:
            self.outages.ok("destination", "destination")

    def _learn_limit(self, err: BaseException) -> None:
        """nsqd's E_BAD_MESSAGE "MPUB message too big N > LIMIT": messages over LIMIT are
        taken out of their batches from now on (the destination's limit is lower than ours)."""
        m = _TOO_BIG.search(str(err))
        if m and int(m.group(2)) < self.max_msg_size:
            self.max_msg_size = int(m.group(2))

    def _too_big(self, m, size: int) -> None:
        """Never copyable as it is: requeue it alone (no backoff: the rest flows on), and after
        max_attempts give up on it (FIN), saying so once."""
        with self.lock:
            self.too_big += 1
        limit = self.max_msg_size
        if self.max_attempts and m.attempts >= self.max_attempts:
            m.finish()
            with self.lock:
                self.given_up += 1
            self.warn(f"gave up on message {m.id.decode(errors='replace')} of topic {m.topic} after "
                      f"{m.attempts} attempts: {size:,} bytes, over the destination's {limit:,}-byte "
                      "message limit; FINed, NOT copied")
            return
        text = (f"a message of {size:,} bytes is over the destination's {limit:,}-byte message limit "
                f"(--destination-max-msg-size): requeued alone, given up after --max-attempts "
                f"{self.max_attempts}" if self.max_attempts else
                f"a message of {size:,} bytes is over the destination's {limit:,}-byte message limit "
                "(--destination-max-msg-size): requeued alone, again and again (--max-attempts 0)")
        if self.outages is not None:
            self.outages.failed("too-big", text)
        m.requeue(delay=min(900.0, self.requeue_delay * max(1, m.attempts)), backoff=False)

    def status(self, elapsed: float) -> str:
        big = (f", over the destination's message limit {self.too_big:,} (given up {self.given_up:,})"
               if self.too_big else "")
        return (f"copied {self.copied:,}, left out by filters {self.filtered:,}, failed batches "
                f"{self.failed_batches} (requeued){big}, {self.copied / max(elapsed, 1e-9):,.0f} msg/s")
