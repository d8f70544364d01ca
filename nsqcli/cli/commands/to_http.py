"""``nsqcli to-http``: deliver messages to a web service (nsq_to_http). FIN after a 2xx (POST) or
200 (GET); REQ with backoff otherwise, after Retry-After when the endpoint says so. The delivery
policy is nsqcli.relay.http_relay's; the run (signals, deadlines, views, metrics) the harness's."""

from __future__ import annotations

import click

from ...relay.endpoints import Endpoint
from ..command import command, option
from ..harness import Job
from ..options import (build_config, connection_options, daemon_options, nsqd_addresses, pop_connection, pop_run,
                       topic_arguments)
from ..types import DURATION
from ..dead_letters import check_dead_letter, dead_letter_options


@command("to-http", examples="""
nsqcli to-http -t events --post http://127.0.0.1:8080/ingest
nsqcli to-http -t events --post http://a/ingest --post http://b/ingest --mode round-robin --concurrency 32
nsqcli to-http -t events --get 'http://127.0.0.1:8080/hook?msg=%s' --sample 0.1
nsqcli to-http -t events --post https://api.example/v1 --header 'Authorization: Bearer X' \\
    --content-type application/json --http-timeout 5s
""")
@topic_arguments(channel=True, channel_default="nsq_to_http", topic_help="Topic to deliver (or the first argument).")
@option("--post", "posts", multiple=True, metavar="URL", help="POST each message body here (repeatable).")
@option("--get", "gets", multiple=True, metavar="URL",
        help="GET this URL with %s replaced by the query-escaped body (repeatable).")
@option("--header", "headers", multiple=True, metavar="'KEY: VALUE'", help="An HTTP header (repeatable).")
@option("--content-type", default="application/octet-stream", show_default=True, help="POST Content-Type.")
@option("--mode", type=click.Choice(["hostpool", "round-robin", "fanout"]), default="hostpool", show_default=True,
        help="hostpool: one endpoint, the next when it fails; round-robin: messages alternate; fanout: every "
             "endpoint (FIN when all succeeded).")
@option("--sample", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
        help="Deliver this fraction of messages; the others are FINed without delivery.")
@option("--concurrency", type=click.IntRange(1, 1000), default=100, show_default=True,
        help="Requests in flight at once (nsq_to_http's -n; here -n is --count as in every nsqcli command).")
@option("--max-in-flight", type=click.IntRange(1, 100000), default=200, show_default=True)
@option("--http-connect-timeout", type=DURATION, default="2s", show_default=True, group="HTTP")
@option("--http-timeout", type=DURATION, default="20s", show_default=True, group="HTTP",
        help="For the whole request.")
@option("--requeue-delay", type=DURATION, default="90s", show_default=True, group="HTTP",
        help="A failed message comes back after this x its attempts (capped at 15m), unless the endpoint "
             "sent Retry-After.")
@option("--max-attempts", type=click.IntRange(0), default=0, show_default=True,
        help="After this many failed attempts: dead-letter the message (--dead-letter-topic) or else FIN it "
             "undelivered, said (0 = retry for ever).")
@option("--grep", "grep", metavar="REGEX", help="Deliver only messages whose body matches REGEX (RE2 syntax, as Go's "
        "regexp, on the body's bytes); the others are FINed undelivered, and counted.")
@option("--where", "where", metavar="EXPR", help="Deliver only messages for which EXPR is true (the others are FINed "
        "undelivered, and counted); the syntax of 'nsqcli tail --where', e.g. '.type == \"order\"'.")
@dead_letter_options
@daemon_options(count_help="Stop after delivering N messages (0 = run until stopped).", log_format="text")
@connection_options(consumer=True)
@click.pass_obj
def to_http(app, topic, channel, posts, gets, headers, content_type, mode, sample, concurrency, max_in_flight,
            http_connect_timeout, http_timeout, requeue_delay, max_attempts, grep, where, dead_letter_topic, count,
            **kwargs):
    """Deliver TOPIC's messages to HTTP endpoints (nsq_to_http).

    A message is FINed after a 2xx answer to a POST (200 to a GET), otherwise requeued with
    backoff: a dead or failing endpoint slows the whole consumer down instead of spinning, and a
    Retry-After (seconds or HTTP date, up to an hour) sets when the message comes back. At least once: killed at
    any moment, what was not FINed is redelivered. When --timeout passes, the requests still in
    flight are given up and requeued at once (the run ends within ~0.5 s of it): an endpoint that
    had taken one gets it again. SIGTERM/SIGINT/SIGHUP instead wait for their answers.
    """
    settings = pop_run(kwargs)
    conn = pop_connection(kwargs)
    check_dead_letter(max_attempts, dead_letter_topic, [topic])
    if bool(posts) == bool(gets):
        raise click.UsageError("give --post URL or --get URL (not both)")
    try:
        endpoints = [Endpoint("POST", u) for u in posts] + [Endpoint("GET", u) for u in gets]
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    hdrs = {}
    for h in headers:
        key, sep, value = h.partition(":")
        if not sep or not key.strip():
            raise click.UsageError(f"--header {h!r} must be 'Key: value'")
        hdrs[key.strip()] = value.strip()
    for text in [*headers, content_type]:
        try:
            text.encode("latin-1")
        except UnicodeEncodeError:
            raise click.UsageError(f"{text!r}: HTTP headers are latin-1; encode other text "
                                   "(e.g. percent- or base64-encode it)") from None
    for name, value in (("--http-timeout", http_timeout), ("--http-connect-timeout", http_connect_timeout)):
        if value <= 0:
            raise click.BadParameter("must be more than 0", param_hint=f"'{name}'")
    from ...filters import FilterError, make_filter

    try:  # before anything starts (ToHttp's Deliverer starts its HTTP thread)
        accept = make_filter(grep, where)
    except FilterError as e:
        raise click.BadParameter(str(e), param_hint=f"'{e.option}'") from None
    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0, default_requeue_delay=requeue_delay)
    job = ToHttp(app, topic, channel, conn, cfg, endpoints, mode, hdrs, content_type, http_connect_timeout,
                 http_timeout, concurrency, count, sample, requeue_delay)
    job.relay.max_attempts, job.relay.warn, job.relay.accept = max_attempts, app.warn, accept
    job.app, job.conn, job.dead_letter_topic = app, conn, dead_letter_topic
    from ..harness import run

    return run(app, job, settings)


class ToHttp(Job):
    name = "to-http"

    def __init__(self, app, topic, channel, conn, cfg, endpoints, mode, headers, content_type, connect_timeout,
                 http_timeout, concurrency, count, sample, requeue_delay):
        super().__init__()
        from ...client.consumer import Consumer
        from ...relay.http_delivery import Deliverer
        from ...relay.http_relay import HttpRelay
        from ..app import Outages, source_error

        self.topic, self.channel, self.count = topic, channel, count
        self.http_budget = http_timeout * len(endpoints) + 5
        self.outages = Outages(app)  # each failure said when it starts, counted, then "recovered"
        self.deliverer = Deliverer(endpoints, mode, headers, content_type, connect_timeout, http_timeout, concurrency)
        self.relay = HttpRelay(self.deliverer, count=count, sample=sample, requeue_delay=requeue_delay,
                               outages=self.outages, done=self.done)
        self.consumer = Consumer(topic, channel, batch_handler=self.relay, config=cfg,
                                 on_error=lambda e: source_error(self.outages, e),
                                 nsqd_tcp_addresses=nsqd_addresses(conn),
                                 lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))

    def consumers(self) -> list:
        return [self.consumer]

    def start(self, deadline, stopper) -> None:
        if getattr(self, "dead_letter_topic", None):
            from ..dead_letters import open_dead_letters

            self.relay.dead = open_dead_letters(self.app, self.conn, self.topic, self.dead_letter_topic, deadline,
                                                self.outages, cancel=self.done.is_set)
        if not self.done.is_set():  # (a signal during the lookup above: stop() follows)
            self.consumer.start(deadline=deadline)  # lookups and handshakes spend the same deadline

    def last_progress(self) -> float:
        return self.relay.last

    def stop(self, end) -> None:
        self.relay.stop(self.consumer, end, self.http_budget)

    def status_lines(self, elapsed: float) -> list[str]:
        return [self.relay.status(elapsed)]

    def counters(self) -> dict:
        r = self.relay
        return {"delivered": r.delivered, "failed_attempts": r.failed, "sampled_out": r.sampled_out,
                "filtered": r.filtered,
                "dead_lettered": r.dead_lettered, "given_up": r.given_up}

    def latency(self) -> dict:
        return self.relay.latency.snapshot()

    def problems(self) -> list[str]:
        failing = self.outages.failing()
        return (["delivery is failing"] if "delivery" in failing else []) + (
            ["the dead-letter topic cannot be published to"] if "dead-letter" in failing else [])

    def finish(self, elapsed, expired, settings, app) -> None:
        r = self.relay
        short = expired and self.count and r.delivered < self.count  # then the error line says the count
        if not short:
            app.info(r.status(elapsed))
        if settings.as_json:
            from ..harness import write_json

            write_json({"topic": self.topic, "channel": self.channel, "delivered": r.delivered,
                        "failed_attempts": r.failed, "sampled_out": r.sampled_out, "filtered": r.filtered,
                        "dead_lettered": r.dead_lettered,
                        "given_up": r.given_up, "elapsed": round(elapsed, 3)})
        if short:
            from ..app import DeadlineExceeded

            raise DeadlineExceeded(f"--timeout passed after {r.delivered} of {self.count} messages delivered")
