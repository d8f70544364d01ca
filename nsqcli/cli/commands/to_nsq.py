"""``nsqcli to-nsq``: copy topics to another NSQ (nsq_to_nsq). A message is FINed only after
the destination acknowledged it (MPUB's OK): killed at any moment, nothing is lost."""

from __future__ import annotations

import threading
import time

import click

from ..command import command, option
from ..harness import Job
from ..options import (build_config, connection_options, daemon_options, destination_options, nsqd_addresses,
                       pop_connection, pop_destination, pop_run, topic_arguments)
from ...relay.copier import Copier, DestinationError
from ..types import DURATION, RATE, TOPIC, Size
from ..dead_letters import check_dead_letter, dead_letter_options


def destination_addresses(app, dest: dict, topics: list[str], deadline: float | None = None) -> list[str]:
    """Destination nsqd: given ones, else those lookupd says carry the (first) topic, else all
    (their HTTP addresses noted for nsqcli.client.limits). Within ``deadline``."""
    if dest.get("nsqd_tcp_addresses"):
        return list(dest["nsqd_tcp_addresses"])
    from ...client import limits
    from ...client.http import cluster_view
    from ...errors import NSQError

    lookupds = list(dest.get("lookupd_http_addresses") or ())
    view = cluster_view(lookupds, topics[0], timeout=_left(deadline, 5.0, "asking the destination nsqlookupd"))
    nodes = view.producers(topics[0]) or list(view.nodes.values())
    if not nodes and view.errors:
        # no answer before --timeout: exit 3 (the work was not done), the reason in the same line
        _left(deadline, 5.0, f"asking the destination nsqlookupd ({view.errors[0]})")
    for e in view.errors:
        app.warn(f"destination nsqlookupd failed: {e}")
    if not nodes:
        raise NSQError(f"the destination nsqlookupd {', '.join(lookupds)} knows no nsqd")
    for n in nodes:
        limits.note_http(n.tcp_address, n.http_address)
    return sorted(n.tcp_address for n in nodes)


def _left(deadline: float | None, most: float, doing: str) -> float:
    """Seconds left for a step (at most ``most``); DeadlineExceeded when --timeout has passed."""
    if deadline is None:
        return most
    left = deadline - time.monotonic()
    if left <= 0:
        from ..app import DeadlineExceeded

        raise DeadlineExceeded(f"--timeout passed while {doing}; nothing was copied")
    return min(most, left)


class Limit:
    """The largest message to send the destination, and where that number came from."""

    def __init__(self, size: int | None, body: int, source: str):
        self.size, self.body, self.source = size, body, source


def ask_limits(app, sources: list[str], destinations: list[str], given: int | None,
               deadline: float | None) -> tuple[Limit, float]:
    """What the nsqd say of themselves (nsqcli.client.limits: /config, one round for all):

    - the largest message to send the destination: --destination-max-msg-size when given,
      else the smallest destination's --max-msg-size (a message may go to any of them), else
      None - nsqd judges, and its "too big" answer sets it (nsqcli.relay.copier);
    - the longest REQ delay for the source: 15 min, or its --max-req-timeout when lower (nsqd
      1.0 closes the connection on a REQ beyond it; later ones clamp)."""
    from ...client import limits

    asked = list(destinations if given is None else ()) + list(sources)
    found = limits.ask(asked, timeout=_left(deadline, limits.ASK_TIMEOUT, "asking nsqd's limits"),
                       deadline=deadline) if asked else {}
    caps = [found[a].max_req_timeout for a in sources if a in found and found[a].max_req_timeout]
    cap = min([900.0] + caps)
    if given is not None:
        return Limit(given, max(5 * 1024 * 1024, given + 8), "--destination-max-msg-size"), cap
    dest = [found[a] for a in destinations]
    sizes = [lim.max_message for lim in dest if lim.max_message is not None]
    bodies = [lim.max_body_size for lim in dest if lim.max_body_size is not None]
    body = min(bodies) if bodies else 5 * 1024 * 1024
    unknown = [lim for lim in dest if lim.max_message is None]
    for lim in unknown:
        app.debug(f"destination nsqd {lim.address}: its --max-msg-size could not be asked ({lim.error or 'no answer'}): "
                  "nsqd judges each message, one it refuses as too big stays in the source")
    if unknown and not sizes:
        return Limit(None, body, ""), cap
    return Limit(min(sizes), body, "its --max-msg-size" if len(dest) == 1 else
                 "the smallest --max-msg-size of the destination nsqd"), cap


@command("to-nsq", examples="""
nsqcli to-nsq -t events --lookupd-http-address 10.0.0.5:4161 --destination-nsqd-tcp-address 10.1.0.7:4150
nsqcli to-nsq -t events -t clicks --destination-lookupd-http-address 10.1.0.5:4161 --mode round-robin
nsqcli to-nsq -t orders --destination-nsqd-tcp-address 10.1.0.7:4150 --destination-topic orders_eu \\
    --require-json-field region --require-json-value eu --whitelist-json-field id --whitelist-json-field total
nsqcli to-nsq -t events --destination-nsqd-tcp-address 10.1.0.7:4150 --destination-tls --rate 5000
""")
@topic_arguments(many=True, channel="option", channel_default="nsq_to_nsq",
                 topic_help="Topic to copy (repeatable; or as arguments).")
@option("--destination-topic", type=TOPIC, help="Publish into this topic (default: the source topic).")
@option("--mode", type=click.Choice(["hostpool", "round-robin", "fanout"]), default="hostpool", show_default=True,
        help="hostpool: one destination, the next when it fails; round-robin: batches alternate; "
             "fanout: every destination (FIN after all acknowledged).")
@option("--max-in-flight", type=click.IntRange(1, 100000), default=2500, show_default=True,
        help="Messages in flight per topic (nsq_to_nsq: 200). A message stays in flight until the "
             "destination acknowledged it, so this bounds how many are being copied at once.")
@option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
        help="Batches being published at once.")
@option("--rate", type=RATE, help="At most N messages per second.")
@option("--grep", "grep", metavar="REGEX", help="Copy only messages whose body matches REGEX (RE2 syntax, as Go's "
        "regexp, on the body's bytes); the others are FINed, counted as left out by filters.")
@option("--where", "where", metavar="EXPR", help="Copy only messages for which EXPR is true (the syntax of 'nsqcli "
        "tail --where'); the others are FINed, counted as left out by filters.")
@option("--require-json-field", help="Copy only JSON messages that have this top-level field.")
@option("--require-json-value", help="... whose value (as text) is this (needs --require-json-field).")
@option("--whitelist-json-field", "whitelist", multiple=True,
        help="Copy only these top-level fields of each JSON message (repeatable).")
@option("--requeue-delay", type=DURATION, default="90s", show_default=True,
        help="A batch the destination refused comes back after this x its attempts (capped at 15m).")
@option("--destination-max-msg-size", type=Size(), default=None, group="Destination",
        help="The largest message to send the destination (default: asked of each destination nsqd's "
             "/config/max_msg_size; the smallest of them). A bigger message is not copied: it stays in the "
             "source, requeued with backoff, said once.")
@option("--max-attempts", type=click.IntRange(0), default=0, show_default=True,
        help="FIN a message over the destination's message limit after this many deliveries, saying so "
             "(0 = never: it stays in the source). Other failures are retried without limit.")
@dead_letter_options
@daemon_options(count_help="Stop after copying N messages (0 = run until stopped).", log_format="text")
@destination_options
@connection_options(consumer=True)
@click.pass_obj
def to_nsq(app, topics, channel, destination_topic, mode, max_in_flight, concurrency, rate, grep, where,
           require_json_field, require_json_value, whitelist, requeue_delay, destination_max_msg_size, max_attempts,
           dead_letter_topic, count, **kwargs):
    """Copy TOPIC(s) from one NSQ to another (nsq_to_nsq), in pipelined MPUB batches.

    A message is FINed only after the destination acknowledged it; when the destination fails,
    what it did not acknowledge is requeued and the consumer backs off. Delivery is at least once: killed at any
    moment, nothing is lost (messages being copied are redelivered and copied again). JSON
    filters FIN what they leave out. The largest message the destination takes is asked of each
    destination nsqd (its /config/max_msg_size; where its HTTP port cannot be found, nsqd's own
    "too big" answer tells it); a bigger message is not copied and not FINed: it stays in the
    source, requeued with backoff, said once (--max-attempts N: FINed after N deliveries,
    said; with --dead-letter-topic T published to T on the source's nsqd, then FINed). Other
    failures (the destination down or refusing) are retried without limit. --timeout bounds
    the whole run, lookups included. Copying a topic
    onto itself (same nsqd or lookupd, same topic) is refused. SIGINT/SIGTERM/SIGHUP stop cleanly
    (exit 0) after the last publish was answered; the summary comes last.
    """
    settings = pop_run(kwargs)
    deadline = settings.deadline
    from ...client.producer import Pacer, Producer

    dest = pop_destination(kwargs)
    conn = pop_connection(kwargs)
    if not dest.get("nsqd_tcp_addresses") and not dest.get("lookupd_http_addresses"):
        raise click.UsageError("give --destination-nsqd-tcp-address or --destination-lookupd-http-address")
    _refuse_copy_onto_itself(conn, dest, topics, destination_topic)
    check_dead_letter(max_attempts, dead_letter_topic, list(topics))
    from ...filters import FilterError, make_filter

    try:
        accept = make_filter(grep, where)
    except FilterError as e:
        raise click.BadParameter(str(e), param_hint=f"'{e.option}'") from None
    if require_json_value is not None and not require_json_field:
        raise click.UsageError("--require-json-value needs --require-json-field")
    if rate:  # a batch is at most ~100 ms of the rate
        max_in_flight = min(max_in_flight, max(1, int(rate / 10)))
    addresses = destination_addresses(app, dest, list(topics), deadline)
    limit, requeue_cap = ask_limits(app, nsqd_addresses(conn), addresses, destination_max_msg_size, deadline)
    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0, concurrency=concurrency,
                       default_requeue_delay=requeue_delay, max_requeue_delay=requeue_cap)
    # the producer refuses nothing itself when the limit is not known: nsqd judges. An MPUB of
    # one message of the largest size: 4 (count) + 4 (size) + body
    dest_cfg = build_config(dest, max_msg_size=limit.size if limit.size is not None else 1 << 31,
                            max_body_size=max(limit.body, (limit.size or 0) + 8))
    job = ToNsq(app, list(topics), channel, conn, cfg, destination_topic, count)
    producer = Producer(addresses, dest_cfg, fanout=mode == "fanout")
    job.copier = Copier(producer, destination_topic, mode,
                        (require_json_field, require_json_value) if require_json_field else None,
                        tuple(whitelist), Pacer(rate) if rate else None, count, job.done,
                        max_msg_size=limit.size, max_attempts=max_attempts, requeue_delay=requeue_delay,
                        max_requeue_delay=requeue_cap, limit_source=limit.source, outages=job.outages, warn=app.warn)
    job.producer = producer
    job.copier.accept = accept
    job.app, job.dead_letter_topic = app, dead_letter_topic
    from ..harness import run

    return run(app, job, settings)


class ToNsq(Job):
    name = "to-nsq"
    connecting = "connecting to the source"
    nothing_done = "nothing was copied"

    def __init__(self, app, topics, channel, conn, cfg, destination_topic, count):
        super().__init__()
        from ..app import Outages

        self.topics, self.channel, self.conn, self.cfg = topics, channel, conn, cfg
        self.destination_topic, self.count = destination_topic, count
        self.outages = Outages(app)
        self.copier = self.producer = None
        self._consumers: list = []

    def consumers(self) -> list:
        with self.consumers_lock:
            return list(self._consumers)

    def start(self, deadline, stopper) -> None:
        from ...client.consumer import Consumer

        if getattr(self, "dead_letter_topic", None):  # messages the destination cannot take, on the source's nsqd
            from ..dead_letters import open_dead_letters

            self.copier.dead = open_dead_letters(self.app, self.conn, self.topics[0], self.dead_letter_topic,
                                                 deadline, self.outages, cancel=self.done.is_set)

        for topic in self.topics:
            c = Consumer(topic, self.channel, batch_handler=self.copier, config=self.cfg,
                         on_error=lambda e: _say(self.outages, e), nsqd_tcp_addresses=nsqd_addresses(self.conn),
                         lookupd_http_addresses=list(self.conn.get("lookupd_http_addresses") or ()))
            self.start_consumer(c, deadline, self._consumers)

    def last_progress(self) -> float:
        return self.copier.last

    def stop(self, end) -> None:
        """Past --timeout the stop has what is left of the grace: a publish still unanswered
        then (a hung destination: its connection attempt is bounded by its own deadline only) is
        neither FINed nor counted, and its messages come back after nsqd's msg_timeout."""
        late = end is not None and time.monotonic() >= end - 0.5

        def budget(most: float) -> float:
            return max(0.05, min(most, end - time.monotonic())) if late else most

        def stop_all():
            for c in self._consumers:
                c.stop(timeout=budget(15))
            self.copier.wait_idle(budget(60))  # a publish still waiting for its answer (bounded by its own timeout)
            if self.copier.dead is not None:
                self.copier.dead.close(budget(10))
            self.producer.close(budget(10))

        if not late:
            stop_all()
            return
        stopping = threading.Thread(target=stop_all, name="nsqcli-stop", daemon=True)
        stopping.start()
        stopping.join(budget(15) + 0.05)

    def status_lines(self, elapsed: float) -> list[str]:
        return [self.copier.status(elapsed)]

    def counters(self) -> dict:
        c = self.copier
        return {"copied": c.copied, "filtered": c.filtered, "failed_batches": c.failed_batches,
                "too_big": c.too_big, "given_up": c.given_up, "dead_lettered": c.dead_lettered}

    def latency(self) -> dict:
        return self.copier.latency.snapshot()

    def problems(self) -> list[str]:
        return ["the destination is failing"] if "destination" in self.outages.failing() else []

    def finish(self, elapsed, expired, settings, app) -> None:
        c = self.copier
        short = expired and self.count and c.copied < self.count  # then the error line says the count
        if not short:
            app.info(c.status(elapsed))  # last: after every publish was answered
        if settings.as_json:
            from ..harness import write_json

            write_json({"topics": self.topics, "destination_topic": self.destination_topic, "copied": c.copied,
                        "filtered": c.filtered, "failed_batches": c.failed_batches, "too_big": c.too_big,
                        "given_up": c.given_up, "dead_lettered": c.dead_lettered, "elapsed": round(elapsed, 3)})
        if short:
            from ..app import DeadlineExceeded

            raise DeadlineExceeded(f"--timeout passed after {c.copied} of {self.count} messages copied")


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
