"""to-nsq's copier: the batch handler that filters/rewrites bodies and MPUBs them to the
destination, FINing a batch only after the destination acknowledged every message."""

from __future__ import annotations

import json
import re
import threading
import time

from .latency import Histogram


class DestinationError(Exception):
    """A batch the destination did not acknowledge in full (the consumer requeues it)."""

    def __init__(self, cause: BaseException | str):
        super().__init__(str(cause))
        self.cause = cause


_TOO_BIG = re.compile(r"too big (\d+) > (\d+)")


#: distinct messages over the destination's limit said one by one; more are only counted
SAY_TOO_BIG = 5


class Copier:
    """The batch handler: filter/rewrite bodies, MPUB them to the destination, return (FIN) only
    after the destination acknowledged every one; raise DestinationError (REQ with backoff) when
    it did not. A message over the destination's message limit is taken out of its batch and
    requeued alone (no backoff, ``requeue_delay`` x its attempts, at most ``max_requeue_delay``),
    said once per message; it is FINed (given up, said) only when the user asked for that with
    ``max_attempts`` > 0. ``max_msg_size`` None: the destination's limit is not known - nsqd
    judges, and its "message too big N > LIMIT" sets it."""

    def __init__(self, producer, topic: str | None, mode: str, require: tuple | None, whitelist: tuple,
                 pacer, count: int, done: threading.Event, *, max_msg_size: int | None = 1024 * 1024,
                 max_attempts: int = 0, requeue_delay: float = 90.0, max_requeue_delay: float = 900.0,
                 limit_source: str = "--destination-max-msg-size", outages=None, warn=None):
        self.producer, self.topic, self.mode = producer, topic, mode
        self.require, self.whitelist, self.pacer = require, whitelist, pacer
        self.count, self.done = count, done
        self.max_msg_size, self.max_attempts, self.requeue_delay = max_msg_size, max_attempts, requeue_delay
        self.max_requeue_delay, self.limit_source = max_requeue_delay, limit_source
        self.outages, self.warn = outages, warn or (lambda text: None)
        self.dead = None  # nsqcli.relay.dead_letter.DeadLetters: --dead-letter-topic
        self.dead_lettered = 0
        self.big_ids: set = set()  # the messages over the limit said so far
        self.accept = None  # --grep/--where (nsqcli.filters.Filter): the others are left out (FINed), counted
        self.lock = threading.Lock()
        self.pace_lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.active = 0
        self.copied = self.filtered = self.failed_batches = self.too_big = self.given_up = 0
        self.last = time.monotonic()
        self.latency = Histogram()  # per MPUB: written to acknowledged by the destination

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
        by_topic: dict[str, list] = {}  # destination topic -> [(message, body)]
        skipped = big = 0
        for m in msgs:
            body = None if self.accept is not None and not self.accept(m) else self._body(m.body)
            if body is None:
                skipped += 1
            elif self.max_msg_size is not None and len(body) > self.max_msg_size:
                big += 1
                self._too_big(m, len(body))
            else:
                by_topic.setdefault(self.topic or m.topic, []).append((m, body))
        if self.pacer is not None:
            with self.pace_lock:  # one clock for every handler thread
                self.pacer.wait(len(msgs) - skipped - big)
        if self.mode == "round-robin" and by_topic:
            self.producer.rotate()
        acked: list = []  # the messages the destination acknowledged
        try:
            for topic, pairs in by_topic.items():
                self._publish(topic, pairs, acked)
        except DestinationError:
            # the rest is requeued by the consumer: what the destination holds is FINed and
            # counted now (requeued too, it came again as duplicates and was not counted)
            for m in acked:
                m.finish()
            self._count(len(acked), 0, bool(acked))
            raise
        self._count(len(acked), skipped, bool(by_topic))

    def _count(self, copied: int, filtered: int, published: bool) -> None:
        with self.lock:
            self.copied += copied
            self.filtered += filtered
            if published:
                self.last = time.monotonic()
            if self.count and self.copied >= self.count:
                self.done.set()

    def _publish(self, topic: str, pairs: list, acked: list) -> None:
        """MPUB the bodies of ``pairs`` ((message, body)); each message the destination
        acknowledged is added to ``acked``. A message nsqd refused alone as too big (after the
        ones before it were acknowledged) is taken out (:meth:`_too_big`) and the rest sent
        again at once; any other failure raises DestinationError (the rest is requeued)."""
        while pairs:
            bodies = [body for _, body in pairs]
            started = time.monotonic()
            try:
                result = self.producer.multi_publish(topic, bodies)
            except Exception as e:
                self._learn_limit(e)
                done = self._acknowledged(e, len(pairs))
                acked.extend(m for m, _ in pairs[:done])
                refused = self._refused_alone(e, done)
                if refused is not None and refused < len(pairs):
                    m, body = pairs[refused]
                    self._too_big(m, len(body))
                    pairs = pairs[refused + 1:]
                    continue
                with self.lock:
                    self.failed_batches += 1
                raise DestinationError(e) from e  # the consumer requeues the rest with backoff
            published = getattr(result, "published", None)
            if published != len(bodies):
                with self.lock:
                    self.failed_batches += 1
                raise DestinationError(f"the destination acknowledged {published} of {len(bodies)} messages "
                                       f"for topic {topic}")
            acked.extend(m for m, _ in pairs)
            self.latency.observe(time.monotonic() - started)
            if self.outages is not None:
                self.outages.ok("destination", "destination")
            return

    def _acknowledged(self, err: BaseException, sent: int) -> int:
        """How many of the first messages sent the destination acknowledged before ``err``
        (PublishError.published: in order). With --mode fanout none count: a message is copied
        only when every destination has it."""
        from ..errors import PublishError

        if self.mode == "fanout" or not isinstance(err, PublishError):
            return 0
        return max(0, min(int(err.published or 0), sent))

    def _refused_alone(self, err: BaseException, done: int) -> int | None:
        """The position of the one message nsqd refused as too big (the ledger split its batch
        down to it, nothing after it was processed), once its limit is known; else None."""
        cause = getattr(err, "cause", None)
        index = getattr(cause, "index", None)
        if index is None or getattr(cause, "code", "") not in ("E_BAD_MESSAGE", "E_BAD_BODY"):
            return None
        if index - 1 != done or self.max_msg_size is None:
            return None
        return done

    def _learn_limit(self, err: BaseException) -> None:
        """nsqd's E_BAD_MESSAGE "MPUB message too big N > LIMIT": messages over LIMIT are
        taken out of their batches from now on (the destination's limit is lower than ours)."""
        m = _TOO_BIG.search(str(err))
        if not m:
            return
        with self.lock:  # handler threads fail side by side
            if self.max_msg_size is None or int(m.group(2)) < self.max_msg_size:
                self.max_msg_size = int(m.group(2))
                self.limit_source = "the destination nsqd said so"

    def _too_big(self, m, size: int) -> None:
        """Not copyable as it is: requeued alone (no backoff: the rest flows on), said once per
        message (the first SAY_TOO_BIG of them), never FINed - unless the user asked for that
        with max_attempts: then FINed after that many deliveries, said."""
        limit = self.max_msg_size
        msg_id = m.id.decode(errors="replace")
        with self.lock:
            self.too_big += 1
            new = msg_id not in self.big_ids
            if new:
                self.big_ids.add(msg_id)
            said = len(self.big_ids)
        if self.max_attempts and m.attempts >= self.max_attempts and self.dead is not None:
            def counted(ok: bool) -> None:
                if ok:
                    with self.lock:
                        self.dead_lettered += 1

            self.dead.submit(m, f"{size:,} bytes, over the destination's {limit:,}-byte message limit "
                                f"(attempt {m.attempts} of --max-attempts {self.max_attempts})",
                             min(self.max_requeue_delay, self.requeue_delay * max(1, m.attempts)), counted)
            return
        if self.max_attempts and m.attempts >= self.max_attempts:
            m.finish()
            with self.lock:
                self.given_up += 1
            self.warn(f"gave up on message {msg_id} of topic {m.topic} after {m.attempts} attempts "
                      f"(--max-attempts): {size:,} bytes, over the destination's {limit:,}-byte message limit; "
                      "FINed, NOT copied")
            return
        delay = min(self.max_requeue_delay, self.requeue_delay * max(1, m.attempts))
        if new and said <= SAY_TOO_BIG:
            fate = "dead-lettered" if self.dead is not None else "FINed (NOT copied)"
            then = (f"requeued for {delay:g}s; it will be {fate} at delivery {self.max_attempts} "
                    f"(--max-attempts; this was delivery {m.attempts})" if self.max_attempts else
                    "it stays in the source, requeued with backoff (raise the destination's --max-msg-size "
                    "to copy it)")
            more = "; further ones are counted in the status line" if said == SAY_TOO_BIG else ""
            self.warn(f"message {msg_id} of topic {m.topic} ({size:,} bytes) is over the destination's "
                      f"{limit:,}-byte message limit ({self.limit_source}): not copied; {then}{more}")
        m.requeue(delay=delay, backoff=False)

    def status(self, elapsed: float) -> str:
        dead = f", dead-lettered {self.dead_lettered:,}" if self.dead is not None else ""
        big = (f", over the destination's message limit {len(self.big_ids):,} (deliveries {self.too_big:,}, "
               f"given up {self.given_up:,}{dead}; the rest stay in the source)" if self.too_big else "")
        return (f"copied {self.copied:,}, left out by filters {self.filtered:,}, failed batches "
                f"{self.failed_batches} (requeued){big}, {self.copied / max(elapsed, 1e-9):,.0f} msg/s")
