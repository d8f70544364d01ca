"""``nsqcli tail``: consume topics and write message bodies to stdout."""

from __future__ import annotations

import random
import sys
import threading
import time

import click

from .options import build_config, connection_options, nsqd_addresses, pop_connection
from .types import CHANNEL, DURATION, TOPIC


class Sink:
    """Writes formatted records to stdout for every consumer; counts toward -n across topics.
    A batch is written and flushed before its messages are FINed (auto-response)."""

    def __init__(self, formatter, separator: bytes, count: int, done: threading.Event):
        self.out = sys.stdout.buffer
        self.format = formatter
        self.sep = separator
        self.count = count
        self.shown = 0
        self.done = done
        self.lock = threading.Lock()
        self.last_message = time.monotonic()
        self.error: BaseException | None = None

    def __call__(self, msgs: list) -> None:
        with self.lock:
            self.last_message = time.monotonic()
            if self.done.is_set():
                keep, extra = [], msgs
            elif self.count:
                room = self.count - self.shown
                keep, extra = msgs[:room], msgs[room:]
            else:
                keep, extra = msgs, []
            for m in extra:  # not shown: give it back at once, without backoff
                m.requeue(delay=0, backoff=False)
            if not keep:
                return
            fmt, sep = self.format, self.sep
            try:
                self.out.write(b"".join([fmt(m) + sep for m in keep]))
                self.out.flush()
            except (BrokenPipeError, OSError) as e:  # `| head` closed the pipe: not shown
                for m in keep:
                    m.requeue(delay=0, backoff=False)
                self.error = e
                self.done.set()
                return
            self.shown += len(keep)
            if self.count and self.shown >= self.count:
                self.done.set()


@click.command()
@click.option("-t", "--topic", "topics", required=True, multiple=True, type=TOPIC,
              help="Topic to tail (repeatable).")
@click.option("-c", "--channel", type=CHANNEL,
              help="Channel (default: a new ephemeral one, so real consumers lose nothing).")
@click.option("--max-in-flight", type=click.IntRange(1, 100000), default=200, show_default=True,
              help="Messages in flight per topic.")
@click.option("-n", "--count", type=click.IntRange(0), default=0,
              help="Stop after N messages in total across topics (0 = no limit).")
@click.option("--idle-timeout", type=DURATION, help="Stop after no message for this long.")
@click.option("--timeout", type=DURATION, help="Hard deadline; exit 3 if --count was not reached by then.")
@click.option("-f", "--format", "fmt", default="raw", show_default=True,
              help="raw, json (NDJSON envelope), or a template like '{topic} {id} {attempts} {body}'.")
@click.option("--print-topic", is_flag=True, help="raw format: prefix each body with 'topic | '.")
@click.option("-0", "--null", "null", is_flag=True, help="End records with NUL instead of newline.")
@click.option("--live", is_flag=True, help="Live table of connections on stderr (TTY only).")
@connection_options(consumer=True)
@click.pass_obj
def tail(app, topics, channel, max_in_flight, count, idle_timeout, timeout, fmt, print_topic, null,
         live, **kwargs):
    """Consume TOPIC(s) and write each message body to stdout.

    Every message shown is FINed; with -n the rest are requeued at once. Ctrl-C, SIGTERM or a
    closed stdout pipe stop cleanly with exit 0.
    """
    from ..client.consumer import Consumer
    from ..errors import NSQError
    from .app import DeadlineExceeded, stop_on_signals
    from ..archive.formats import Formatter

    conn = pop_connection(kwargs)
    try:
        formatter = Formatter(fmt, print_topic)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if count and count < max_in_flight:
        max_in_flight = count
    if channel is None:
        channel = f"nsqcli_tail{random.randrange(1_000_000):06d}#ephemeral"
    elif not channel.endswith("#ephemeral"):
        app.warn(f"tailing durable channel {channel!r}: messages shown here are taken from its other consumers")
    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0)
    done = threading.Event()
    sink = Sink(formatter, b"\0" if null else b"\n", count, done)
    consumers = []

    def on_error(err):
        app.warn(str(err))

    stop_on_signals(done)
    deadline = time.monotonic() + timeout if timeout else None
    try:
        for topic in topics:
            if done.is_set():
                break
            c = Consumer(topic, channel, batch_handler=sink, config=cfg, on_error=on_error,
                         nsqd_tcp_addresses=nsqd_addresses(conn),
                         lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))
            try:
                c.start(deadline=deadline)
            except NSQError as e:
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceeded(f"--timeout passed while connecting: {e}") from e
                raise
            consumers.append(c)
        app.debug(f"tailing {', '.join(topics)} on channel {channel}")
        timed_out = _wait(done, sink, consumers, timeout, idle_timeout, live, app)
    finally:
        done.set()
        for c in consumers:
            c.stop(timeout=10)
    if sink.error is None:
        sys.stdout.flush()
    elif not isinstance(sink.error, BrokenPipeError):  # e.g. ENOSPC: what was shown is not durable
        raise OSError(sink.error.errno, f"cannot write to stdout: {sink.error.strerror or sink.error}; "
                      f"{sink.shown} messages were written and FINed, the rest were requeued")
    for c in consumers:
        t = c.totals()
        if t["timed_out"] or t["lost_responses"] or t["late_messages"]:
            app.warn(f"topic {c.topic}: {t['timed_out']} answers came after nsqd's message timeout, "
                     f"{t['lost_responses']} could not be sent (connection gone), {t['late_messages']} "
                     "messages arrived after close - nsqd redelivers those")
    if timed_out and count and sink.shown < count:
        raise DeadlineExceeded(f"--timeout passed after {sink.shown} of {count} messages")
    return 0


def _wait(done, sink, consumers, timeout, idle_timeout, live, app) -> bool:
    """Block until done; returns True when the hard --timeout ended the run."""
    deadline = time.monotonic() + timeout if timeout else None
    view = None
    if live:
        if app.stderr_is_tty:
            from .views import LiveConnections

            view = LiveConnections(app.console, consumers).start()
        else:
            app.warn("--live needs a terminal on stderr; ignoring it")
    try:
        while not done.wait(0.1):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return True
            if idle_timeout and now - sink.last_message >= idle_timeout:
                return False
    finally:
        if view is not None:
            view.stop()
    return False
