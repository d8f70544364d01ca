"""``nsqcli to-nsq``: copy topics to another NSQ (nsq_to_nsq). A message is FINed only after
the destination acknowledged it (MPUB's OK): killed at any moment, nothing is lost."""

from __future__ import annotations

import json
import re
import sys
import threading
import time

import click

from ..command import command, option
from ..options import (build_config, connection_options, destination_options, nsqd_addresses,
                      pop_connection, pop_destination)
from .to_file import Size
from ..types import CHANNEL, DURATION, TOPIC


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


def destination_addresses(app, dest: dict, topics: list[str]) -> list[str]:
    """Destination nsqd: given ones, else those lookupd says carry the (first) topic, else all."""
    if dest.get("nsqd_tcp_addresses"):
        return list(dest["nsqd_tcp_addresses"])
    from ...client.http import cluster_view
    from ...errors import NSQError

    lookupds = list(dest.get("lookupd_http_addresses") or ())
    view = cluster_view(lookupds, topics[0])
    for e in view.errors:
        app.warn(f"destination nsqlookupd failed: {e}")
    nodes = view.producers(topics[0]) or list(view.nodes.values())
    if not nodes:
        raise NSQError(f"the destination nsqlookupd {', '.join(lookupds)} knows no nsqd")
    return sorted(n.tcp_address for n in nodes)


@command("to-nsq", examples="""
nsqcli to-nsq -t events --lookupd-http-address 10.0.0.5:4161 --destination-nsqd-tcp-address 10.1.0.7:4150
nsqcli to-nsq -t events -t clicks --destination-lookupd-http-address 10.1.0.5:4161 --mode round-robin
nsqcli to-nsq -t orders --destination-nsqd-tcp-address 10.1.0.7:4150 --destination-topic orders_eu \\
    --require-json-field region --require-json-value eu --whitelist-json-field id --whitelist-json-field total
nsqcli to-nsq -t events --destination-nsqd-tcp-address 10.1.0.7:4150 --destination-tls --rate 5000
""")
@option("-t", "--topic", "topics", multiple=True, required=True, type=TOPIC, help="Topic to copy (repeatable).")
@option("-c", "--channel", type=CHANNEL, default="nsq_to_nsq", show_default=True)
@option("--destination-topic", type=TOPIC, help="Publish into this topic (default: the source topic).")
@option("--mode", type=click.Choice(["hostpool", "round-robin", "fanout"]), default="hostpool", show_default=True,
        help="hostpool: one destination, the next when it fails; round-robin: batches alternate; "
             "fanout: every destination (FIN after all acknowledged).")
@option("--max-in-flight", type=click.IntRange(1, 100000), default=2500, show_default=True,
        help="Messages in flight per topic (nsq_to_nsq: 200; 2500 measured 1.15x faster than 1000).")
@option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
        help="Batches being published at once.")
@option("--rate", type=click.FloatRange(min=0, min_open=True), help="At most N messages per second.")
@option("--require-json-field", help="Copy only JSON messages that have this top-level field.")
@option("--require-json-value", help="... whose value (as text) is this (needs --require-json-field).")
@option("--whitelist-json-field", "whitelist", multiple=True,
        help="Copy only these top-level fields of each JSON message (repeatable).")
@option("--requeue-delay", type=DURATION, default="90s", show_default=True,
        help="A batch the destination refused comes back after this x its attempts (capped at 15m).")
@option("--destination-max-msg-size", type=Size(), default="1M", show_default=True, group="Destination",
        help="The largest message the destination nsqd accepts (its --max-msg-size; raise both to copy "
             "bigger messages). A bigger message is requeued alone, then given up after --max-attempts.")
@option("--max-attempts", type=click.IntRange(0), default=5, show_default=True,
        help="Give up on a message over --destination-max-msg-size after this many deliveries: FIN it and "
             "say so (0 = requeue it forever). Other failures are retried without limit.")
@option("-n", "--count", type=click.IntRange(0), default=0, help="Stop after copying N messages (0 = run until stopped).")
@option("--idle-timeout", type=DURATION, help="Stop after no message for this long.")
@option("--live/--no-live", default=None, help="Live connections table (default: when stderr is a TTY).")
@option("--status-interval", type=DURATION, default="60s", show_default=True,
        help="Without --live: a status line this often (0 = off).")
@destination_options
@connection_options(consumer=True)
@click.pass_obj
def to_nsq(app, topics, channel, destination_topic, mode, max_in_flight, concurrency, rate, require_json_field,
           require_json_value, whitelist, requeue_delay, destination_max_msg_size, max_attempts, count, idle_timeout,
           live, status_interval, **kwargs):
    """Copy TOPIC(s) from one NSQ to another (nsq_to_nsq), in pipelined MPUB batches.

    A message is FINed only after the destination acknowledged it; when the destination fails,
    the batch is requeued and the consumer backs off. Delivery is at least once: killed at any
    moment, nothing is lost (messages being copied are redelivered and copied again). JSON
    filters FIN what they leave out. A message over --destination-max-msg-size cannot be copied:
    it is requeued on its own and, after --max-attempts, FINed with a warning. Copying a topic
    onto itself (same nsqd or lookupd, same topic) is refused. SIGINT/SIGTERM stop cleanly
    (exit 0) after the last publish was answered; the summary comes last.
    """
    from ...client.consumer import Consumer
    from ...client.producer import Pacer, Producer
    from ..app import Outages, sources_recovered

    dest = pop_destination(kwargs)
    conn = pop_connection(kwargs)
    if not dest.get("nsqd_tcp_addresses") and not dest.get("lookupd_http_addresses"):
        raise click.UsageError("give --destination-nsqd-tcp-address or --destination-lookupd-http-address")
    _refuse_copy_onto_itself(conn, dest, topics, destination_topic)
    if require_json_value is not None and not require_json_field:
        raise click.UsageError("--require-json-value needs --require-json-field")
    if idle_timeout is not None and idle_timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--idle-timeout'")
    if rate:  # a batch is at most ~100 ms of the rate
        max_in_flight = min(max_in_flight, max(1, int(rate / 10)))
    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0, concurrency=concurrency,
                       default_requeue_delay=requeue_delay)
    # an MPUB of one message of the largest size: 4 (count) + 4 (size) + body
    dest_cfg = build_config(dest, max_msg_size=destination_max_msg_size,
                            max_body_size=max(5 * 1024 * 1024, destination_max_msg_size + 8))
    done = threading.Event()
    outages = Outages(app)
    producer = Producer(destination_addresses(app, dest, list(topics)), dest_cfg, fanout=mode == "fanout")
    copier = Copier(producer, destination_topic, mode,
                    (require_json_field, require_json_value) if require_json_field else None,
                    tuple(whitelist), Pacer(rate) if rate else None, count, done,
                    max_msg_size=destination_max_msg_size, max_attempts=max_attempts,
                    requeue_delay=requeue_delay, outages=outages, warn=app.warn)
    consumers = []
    from ..signals import GracefulStop

    stopper = GracefulStop(done).install()
    start = time.monotonic()
    view = None
    try:
        for topic in topics:
            c = Consumer(topic, channel, batch_handler=copier, config=cfg, on_error=lambda e: _say(outages, e),
                         nsqd_tcp_addresses=nsqd_addresses(conn),
                         lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))
            with stopper.blocking():  # a signal while connecting ends it at once (130)
                c.start()
            consumers.append(c)
        if live or (live is None and app.stderr_is_tty):
            from ..views import LiveConnections

            view = LiveConnections(app.console, consumers).start()
        next_status = start + status_interval if status_interval and view is None else None
        while not done.wait(0.2):
            now = time.monotonic()
            if idle_timeout and now - copier.last >= idle_timeout:
                break
            if next_status is not None and now >= next_status:
                app.info(copier.status(now - start))
                next_status = now + status_interval
            sources_recovered(outages, consumers)
    finally:
        done.set()
        if view is not None:
            view.stop()
        for c in consumers:
            c.stop(timeout=15)
        copier.wait_idle(60)  # a publish still waiting for its answer (bounded by its own timeout)
        producer.close()
    app.info(copier.status(time.monotonic() - start))  # last: after every publish was answered
    sys.stderr.flush()
    return 0


def _say(outages, err) -> None:
    from ..app import source_error

    """Errors of the consumers: a destination failure (the batch is requeued) or a source nsqd
    lost/refusing; each said when it starts, counted while it lasts, and 'recovered' after."""
    if isinstance(err, DestinationError):
        cause = getattr(err.cause, "cause", None) or err.cause
        outages.failed("destination", f"destination: {cause} (the batch is requeued; the consumer backs off)")
        return
    source_error(outages, err)


def _norm(address: str) -> str:
    """HOST:PORT as typed, lower-cased, without an http:// scheme or a trailing slash."""
    a = address.strip().lower()
    for scheme in ("http://", "https://"):
        if a.startswith(scheme):
            a = a[len(scheme):]
    return a.rstrip("/")


def _refuse_copy_onto_itself(conn: dict, dest: dict, topics, destination_topic) -> None:
    """Copying a topic into itself multiplies its messages (each copy is copied again): a
    usage error, before anything connects. Same HOST:PORT strings only (localhost vs 127.0.0.1
    is not resolved)."""
    same_topics = [t for t in topics if (destination_topic or t) == t]
    if not same_topics:
        return
    src_nsqd = {_norm(a) for a in nsqd_addresses(conn)}
    src_lookupd = {_norm(a) for a in conn.get("lookupd_http_addresses") or ()}
    for kind, ours, theirs in (("nsqd", src_nsqd, dest.get("nsqd_tcp_addresses")),
                               ("nsqlookupd", src_lookupd, dest.get("lookupd_http_addresses"))):
        shared = sorted(ours & {_norm(a) for a in theirs or ()})
        if shared:
            raise click.UsageError(f"to-nsq onto itself: {kind} {shared[0]} is both source and destination and "
                                   f"topic {same_topics[0]} would be copied into itself (every copy copied "
                                   "again); give another --destination-topic or destination")
