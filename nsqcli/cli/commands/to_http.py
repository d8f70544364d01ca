"""``nsqcli to-http``: deliver messages to a web service (nsq_to_http). FIN after a 2xx (POST) or
200 (GET); REQ with backoff otherwise, after Retry-After when the endpoint says so."""

from __future__ import annotations

import random
import threading
import time

import click

from ...relay.http_delivery import Deliverer, Endpoint
from ..command import command, option
from ..options import (build_config, check_timeout, connection_options, deadline_of, nsqd_addresses,
                       pop_connection, relay_run_options, topic_arguments)
from ..types import DURATION

#: after --timeout passed, what the stop may still take (REQ what is in flight, close): the
#: whole command ends within ~0.5 s of its deadline
STOP_GRACE = 0.35


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.delivered = self.failed = self.sampled_out = 0
        self.sending = 0  # requests started and not finished (-n counts them as taken)
        self.last = time.monotonic()


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
@relay_run_options("Stop after delivering N messages (0 = run until stopped).")
@connection_options(consumer=True)
@click.pass_obj
def to_http(app, topic, channel, posts, gets, headers, content_type, mode, sample, concurrency, max_in_flight,
            http_connect_timeout, http_timeout, requeue_delay, count, idle_timeout, timeout, live, status_interval, as_json,
            **kwargs):
    """Deliver TOPIC's messages to HTTP endpoints (nsq_to_http).

    A message is FINed after a 2xx answer to a POST (200 to a GET), otherwise requeued with
    backoff: a dead or failing endpoint slows the whole consumer down instead of spinning, and a
    Retry-After (seconds or HTTP date) sets when the message comes back. At least once: killed at
    any moment, what was not FINed is redelivered. When --timeout passes, the requests still in
    flight are given up and requeued at once (the run ends within ~0.5 s of it): an endpoint that
    had taken one gets it again. SIGTERM/SIGINT instead wait for their answers.
    """
    check_timeout(timeout)
    deadline = deadline_of(timeout)  # the whole command's, counted from process start
    from ...client.consumer import Consumer
    from ..app import Outages, source_error, sources_recovered

    conn = pop_connection(kwargs)
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
    deliverer = Deliverer(endpoints, mode, hdrs, content_type, http_connect_timeout, http_timeout, concurrency)
    stats = Stats()
    outages = Outages(app)  # each failure said when it starts, counted, then "recovered"
    done = threading.Event()
    rng = random.Random()

    def claim() -> bool:
        """-n N: a request may start only while delivered + sending < N (with 100 requests in
        flight, the ones already started when the Nth succeeded delivered N + 28)."""
        with stats.lock:
            if count and stats.delivered + stats.sending >= count:
                return False
            stats.sending += 1
            return True

    def may_start(m) -> bool:
        if done.is_set() or not claim():  # stopping, or -n is taken: it goes back at once
            m.requeue(delay=0, backoff=False)
            return False
        return True

    def delivered(m, e) -> None:
        """The deliverer's answer for ``m`` (I/O thread): FIN, or REQ with backoff."""
        with stats.lock:
            stats.sending -= 1
        if e is not None and e.abandoned:  # given up at the deadline: not the endpoint's fault
            m.requeue(delay=0, backoff=False)
            return
        if e is not None:
            with stats.lock:
                stats.failed += 1
            outages.failed("delivery", f"{e} (requeued; the consumer backs off)")
            delay = e.retry_after if e.retry_after is not None else min(900.0, requeue_delay * m.attempts)
            m.requeue(delay=delay, backoff=True)
            return
        m.finish()
        outages.ok("delivery", "delivery")
        with stats.lock:
            stats.delivered += 1
            stats.last = time.monotonic()
            if count and stats.delivered >= count:
                done.set()

    def handle(msgs) -> None:
        for m in msgs:
            if done.is_set():
                m.requeue(delay=0, backoff=False)
                continue
            if sample < 1.0 and rng.random() >= sample:
                with stats.lock:
                    stats.sampled_out += 1
                continue  # FINed by the batch (auto-response)
            m.auto_response = False  # answered when the deliverer is done with it
            try:
                deliverer.submit(m.body, lambda e, m=m: delivered(m, e), lambda m=m: may_start(m), m)
            except RuntimeError:  # closed: stopping
                m.requeue(delay=0, backoff=False)

    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0, default_requeue_delay=requeue_delay)
    c = Consumer(topic, channel, batch_handler=handle, config=cfg, on_error=lambda e: source_error(outages, e),
                 nsqd_tcp_addresses=nsqd_addresses(conn),
                 lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))
    from ...errors import NSQError
    from ..app import DeadlineExceeded
    from ..signals import GracefulStop

    stopper = GracefulStop(done).install()
    start = time.monotonic()
    view = None
    expired = False
    try:
        with stopper.blocking():  # a signal while connecting ends it at once (130)
            try:
                c.start(deadline=deadline)  # lookups and handshakes spend the same deadline
            except NSQError as e:
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceeded(f"--timeout passed while connecting: {e}") from e
                raise
        if live or (live is None and app.stderr_is_tty):
            from ..views import LiveConnections

            view = LiveConnections(app.console, [c]).start()
        next_status = start + status_interval if status_interval and view is None else None
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                expired = True
                break
            if done.wait(0.2 if deadline is None else min(0.2, deadline - now)):
                break
            now = time.monotonic()
            if idle_timeout and now - max(stats.last, start) >= idle_timeout:
                break
            if next_status is not None and now >= next_status:
                app.info(_status(stats, now - start))
                next_status = now + status_interval
            sources_recovered(outages, [c])
    finally:
        done.set()
        if view is not None:
            view.stop()
        # no more messages (CLS; what still arrives goes back at once, not round and round),
        # every request in flight is answered (FIN or REQ) before the consumer closes, the ones
        # not started go back at once. With --timeout all of it within STOP_GRACE of the
        # deadline: the requests still in flight then are given up (REQ at once: at least once)
        end = None if deadline is None else max(deadline, time.monotonic()) + STOP_GRACE

        def left(cap: float) -> float:
            return cap if end is None else max(0.01, min(cap, end - time.monotonic()))

        c.drain(timeout=left(5))
        handed_back = deliverer.close(timeout=left(http_timeout * len(endpoints) + 5) if end is None
                                      else max(0.0, end - 0.15 - time.monotonic()))
        if not deliverer.finished:
            deliverer.abort("given up: --timeout passed" if end is not None else "given up while stopping")
            handed_back += deliverer.close(timeout=left(1))
        for m in handed_back:
            m.requeue(delay=0, backoff=False)
        c.stop(timeout=left(15))
    elapsed = time.monotonic() - start
    short = expired and count and stats.delivered < count  # then the error line says the count
    if not short:
        app.info(_status(stats, elapsed))
    if as_json:
        import json

        from ..app import write_stdout

        write_stdout(json.dumps({"topic": topic, "channel": channel, "delivered": stats.delivered,
                                 "failed_attempts": stats.failed, "sampled_out": stats.sampled_out,
                                 "elapsed": round(elapsed, 3)}) + "\n")
    if short:
        raise DeadlineExceeded(f"--timeout passed after {stats.delivered} of {count} messages delivered")
    return 0


def _status(stats: Stats, elapsed: float) -> str:
    return (f"delivered {stats.delivered:,}, failed attempts {stats.failed:,} (requeued), sampled out "
            f"{stats.sampled_out:,}, {stats.delivered / max(elapsed, 1e-9):,.0f} msg/s")
