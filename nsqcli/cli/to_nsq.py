"""``nsqcli to-nsq``: copy topics to another NSQ (nsq_to_nsq). A message is FINed only after
the destination acknowledged it (MPUB's OK): killed at any moment, nothing is lost."""

from __future__ import annotations

import json
import sys
import threading
import time

import click

from .command import command, option
from .options import (build_config, connection_options, destination_options, nsqd_addresses,
                      pop_connection, pop_destination)
from .types import CHANNEL, DURATION, TOPIC


class Copier:
    """The batch handler: filter/rewrite bodies, MPUB them to the destination, return (FIN) only
    after the OK; raise (REQ with backoff) when the destination fails."""

    def __init__(self, producer, topic: str | None, mode: str, require: tuple | None, whitelist: tuple,
                 pacer, count: int, done: threading.Event):
        self.producer, self.topic, self.mode = producer, topic, mode
        self.require, self.whitelist, self.pacer = require, whitelist, pacer
        self.count, self.done = count, done
        self.lock = threading.Lock()
        self.pace_lock = threading.Lock()
        self.copied = self.filtered = self.failed_batches = 0
        self.last = time.monotonic()
        self.errors_said: set[str] = set()

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
        skipped = 0
        for m in msgs:
            body = self._body(m.body)
            if body is None:
                skipped += 1
                continue
            by_topic.setdefault(self.topic or m.topic, []).append(body)
        if self.pacer is not None:
            with self.pace_lock:  # one clock for every handler thread
                self.pacer.wait(len(msgs) - skipped)
        if self.mode == "round-robin":
            self.producer.rotate()
        for topic, bodies in by_topic.items():
            try:
                self.producer.multi_publish(topic, bodies)
            except Exception:
                with self.lock:
                    self.failed_batches += 1
                raise  # the consumer requeues the batch with backoff
        with self.lock:
            self.copied += len(msgs) - skipped
            self.filtered += skipped
            self.last = time.monotonic()
            if self.count and self.copied >= self.count:
                self.done.set()

    def status(self, elapsed: float) -> str:
        return (f"copied {self.copied:,}, left out by filters {self.filtered:,}, failed batches "
                f"{self.failed_batches} (requeued), {self.copied / max(elapsed, 1e-9):,.0f} msg/s")


def destination_addresses(app, dest: dict, topics: list[str]) -> list[str]:
    """Destination nsqd: given ones, else those lookupd says carry the (first) topic, else all."""
    if dest.get("nsqd_tcp_addresses"):
        return list(dest["nsqd_tcp_addresses"])
    from ..client.http import cluster_view
    from ..errors import NSQError

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
@option("-n", "--count", type=click.IntRange(0), default=0, help="Stop after copying N messages (0 = run until stopped).")
@option("--idle-timeout", type=DURATION, help="Stop after no message for this long.")
@option("--live/--no-live", default=None, help="Live connections table (default: when stderr is a TTY).")
@option("--status-interval", type=DURATION, default="60s", show_default=True,
        help="Without --live: a status line this often (0 = off).")
@destination_options
@connection_options(consumer=True)
@click.pass_obj
def to_nsq(app, topics, channel, destination_topic, mode, max_in_flight, concurrency, rate, require_json_field,
           require_json_value, whitelist, requeue_delay, count, idle_timeout, live, status_interval, **kwargs):
    """Copy TOPIC(s) from one NSQ to another (nsq_to_nsq), in pipelined MPUB batches.

    A message is FINed only after the destination acknowledged it; when the destination fails,
    the batch is requeued and the consumer backs off. Delivery is at least once: killed at any
    moment, nothing is lost (messages being copied are redelivered and copied again). JSON
    filters FIN what they leave out. SIGINT/SIGTERM stop cleanly (exit 0).
    """
    from ..client.consumer import Consumer
    from ..client.producer import Pacer, Producer
    from .app import stop_on_signals

    dest = pop_destination(kwargs)
    conn = pop_connection(kwargs)
    if not dest.get("nsqd_tcp_addresses") and not dest.get("lookupd_http_addresses"):
        raise click.UsageError("give --destination-nsqd-tcp-address or --destination-lookupd-http-address")
    if require_json_value is not None and not require_json_field:
        raise click.UsageError("--require-json-value needs --require-json-field")
    if idle_timeout is not None and idle_timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--idle-timeout'")
    if rate:  # a batch is at most ~100 ms of the rate
        max_in_flight = min(max_in_flight, max(1, int(rate / 10)))
    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0, concurrency=concurrency,
                       default_requeue_delay=requeue_delay)
    dest_cfg = build_config(dest)
    done = threading.Event()
    producer = Producer(destination_addresses(app, dest, list(topics)), dest_cfg, fanout=mode == "fanout")
    copier = Copier(producer, destination_topic, mode,
                    (require_json_field, require_json_value) if require_json_field else None,
                    tuple(whitelist), Pacer(rate) if rate else None, count, done)
    consumers = []
    stop_on_signals(done)
    start = time.monotonic()
    view = None
    try:
        for topic in topics:
            c = Consumer(topic, channel, batch_handler=copier, config=cfg, on_error=lambda e: _say(app, copier, e),
                         nsqd_tcp_addresses=nsqd_addresses(conn),
                         lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))
            c.start()
            consumers.append(c)
        if live or (live is None and app.stderr_is_tty):
            from .views import LiveConnections

            view = LiveConnections(app.console, consumers).start()
        next_status = start + status_interval if status_interval and view is None else None
        while not done.wait(0.2):
            now = time.monotonic()
            if idle_timeout and now - copier.last >= idle_timeout:
                break
            if next_status is not None and now >= next_status:
                app.info(copier.status(now - start))
                next_status = now + status_interval
    finally:
        done.set()
        if view is not None:
            view.stop()
        for c in consumers:
            c.stop(timeout=15)
        producer.close()
    app.info(copier.status(time.monotonic() - start))
    sys.stderr.flush()
    return 0


def _say(app, copier: Copier, err) -> None:
    """A destination failure is said once per distinct message (a dead destination would
    otherwise say it for every batch)."""
    cause = getattr(err, "cause", None) or err
    text = str(cause)
    if text not in copier.errors_said:
        copier.errors_said.add(text)
        app.warn(f"destination: {text} (the batch is requeued; the consumer backs off)")
