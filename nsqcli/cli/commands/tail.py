"""``nsqcli tail``: consume topics and write message bodies to stdout."""

from __future__ import annotations

import random
import sys
import threading
import time

import click

from ..command import command, option
from ..options import build_config, connection_options, deadline_of, nsqd_addresses, pop_connection, topic_arguments
from ..types import DURATION, HTTP_ADDRESS
from ...clock import left


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


@command(examples="""
nsqcli tail events                            # bodies on stdout; a fresh ephemeral channel
nsqcli tail events clicks -n 100 -f json > sample.ndjson
nsqcli tail events -f '{time} {nsqd} {attempts} {body}' --timeout 10s -n 5
nsqcli tail events --live > /tmp/bodies.txt   # the connections table on the terminal
nsqcli tail events -c audit                   # a durable channel (takes from its other consumers)
nsqcli tail -t events --lookupd-http-address 127.0.0.1:4161
""")
@topic_arguments(many=True, channel="option", topic_help="Topic to tail (repeatable; or as arguments).",
                 channel_help="Channel (default: a new ephemeral one, so real consumers lose nothing).")
@option("--max-in-flight", type=click.IntRange(1, 100000), default=200, show_default=True,
        help="Messages in flight per topic.")
@option("-n", "--count", type=click.IntRange(0), default=0,
        help="Stop after N messages in total across topics (0 = no limit).")
@option("--idle-timeout", type=DURATION, help="Stop after no message for this long.")
@option("--timeout", type=DURATION, help="Hard deadline; exit 3 if --count was not reached by then (0 is refused).")
@option("-f", "--format", "fmt", default="raw", show_default=True,
        help="raw, json (NDJSON envelope), or a template like '{topic} {id} {attempts} {body}'.")
@option("--print-topic", is_flag=True, help="raw format: prefix each body with 'topic | '.")
@option("-0", "--null", "null", is_flag=True, help="End records with NUL instead of newline.")
@option("--live", is_flag=True, help="Live table of connections on stderr (needs stdout redirected "
        "when stderr is the same terminal).")
@option("--drain-backlog", is_flag=True, help="Subscribe an ephemeral channel even to a topic with a backlog "
        "and no channel yet (it takes the backlog and keeps only nsqd's --mem-queue-size of it).")
@option("--nsqd-http-address", "nsqd_http", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS",
        show_envvar=True, group="Connection",
        help="nsqd HTTP address for the backlog check (default: lookupd's answer, or the TCP port + 1).")
@connection_options(consumer=True)
@click.pass_obj
def tail(app, topics, channel, max_in_flight, count, idle_timeout, timeout, fmt, print_topic, null,
         live, drain_backlog, nsqd_http, **kwargs):
    """Consume TOPIC(s) and write each message body to stdout.

    Every message shown is FINed; with -n the rest are requeued at once. Ctrl-C, SIGTERM or a
    closed stdout pipe stop cleanly with exit 0.

    Before subscribing an ephemeral channel to a topic that has a backlog and no channel yet,
    tail refuses (exit 1): the first channel of a topic receives its whole backlog, and an
    ephemeral one would keep only --mem-queue-size of it and drop the rest for every
    channel created later. Use --channel NAME, or --drain-backlog to go ahead.
    """
    from ...client.consumer import Consumer
    from ...errors import NSQError
    from ..app import DeadlineExceeded
    from ...records import Formatter

    conn = pop_connection(kwargs)
    topics = tuple(topics)
    try:
        formatter = Formatter(fmt, print_topic)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--format'") from None
    if print_topic and fmt != "raw":
        raise click.UsageError("--print-topic goes with --format raw (a template can use {topic})")
    if timeout is not None and timeout <= 0:
        raise click.BadParameter("must be more than 0 (leave it out for no deadline)", param_hint="'--timeout'")
    if idle_timeout is not None and idle_timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--idle-timeout'")
    if live and app.stderr_is_tty and sys.stdout.isatty() and _same_terminal():
        raise click.UsageError("--live draws on the terminal that also gets the messages: redirect stdout "
                               "(nsqcli tail TOPIC --live > FILE) or leave out --live")
    deadline = deadline_of(timeout)
    # the pre-checks (backlog, shared channel) of every topic share one budget: 3 s, or what is
    # left of --timeout; a hung nsqlookupd or nsqd costs that once, not once per topic and stage
    check_by = time.monotonic() + 3.0 if deadline is None else min(time.monotonic() + 3.0, deadline)
    if count and count < max_in_flight:
        max_in_flight = count
    if channel is None:
        channel = f"nsqcli_tail{random.randrange(1_000_000):06d}#ephemeral"
    elif not channel.endswith("#ephemeral"):
        for topic in topics:
            _warn_shared_channel(app, topic, channel, conn, list(nsqd_http), check_by)
    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0)
    unchecked = {}  # topic -> why its backlog could not be checked (said once it is connected)
    if channel.endswith("#ephemeral") and not drain_backlog:
        for topic in topics:
            unchecked[topic] = _refuse_backlog(topic, conn, list(nsqd_http), check_by)
    if deadline is not None and time.monotonic() >= deadline:
        raise DeadlineExceeded("--timeout passed while asking nsqd/nsqlookupd about the topics, before subscribing "
                               f"({'; '.join(p for ps in unchecked.values() for p in ps) or 'no answer in time'})")
    done = threading.Event()
    sink = Sink(formatter, b"\0" if null else b"\n", count, done)
    consumers = []

    from ..app import Outages, source_error

    outages = Outages(app)

    def on_error(err):  # said when it starts, counted while it lasts, "recovered" when it ends
        source_error(outages, err)

    from ..signals import GracefulStop

    stopper = GracefulStop(done).install()  # a signal while connecting ends it at once (130)
    try:
        for topic in topics:
            if done.is_set():
                break
            c = Consumer(topic, channel, batch_handler=sink, config=cfg, on_error=on_error,
                         nsqd_tcp_addresses=nsqd_addresses(conn),
                         lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))
            try:
                with stopper.blocking():
                    c.start(deadline=deadline)
            except NSQError as e:
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceeded(f"--timeout passed while connecting: {e}") from e
                raise
            consumers.append(c)
            if unchecked.get(topic) and c.stats():
                app.warn(f"could not check topic {topic!r} for a backlog without channels "
                         f"({'; '.join(unchecked[topic])}); if it had one, this ephemeral channel took it and "
                         "keeps only nsqd's --mem-queue-size of it (give --nsqd-http-address to check)")
        app.debug(f"tailing {', '.join(topics)} on channel {channel}")
        timed_out = _wait(done, sink, consumers, deadline, idle_timeout, live, app, conn, outages)
    finally:
        done.set()
        # a clean stop (FINs out, CLS answered) takes milliseconds on healthy nodes; past the
        # deadline a hung one is given 0.1 s, not ten (what it holds in flight it redelivers)
        stop_by = 10.0 if deadline is None else min(10.0, max(0.1, deadline + 0.1 - time.monotonic()))
        for c in consumers:
            c.stop(timeout=stop_by)
    outages.say_still_failing()
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


def _same_terminal() -> bool:
    import os

    try:
        a, b = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino, a.st_rdev) == (b.st_dev, b.st_ino, b.st_rdev)


def _left(by: float) -> float:
    return left(by, float("inf"))


def _http_addresses(topic: str, conn: dict, nsqd_http: list[str], by: float) -> tuple[list[str], list[str]]:
    """nsqd HTTP addresses to check for ``topic``: given ones; lookupd's producers; else the TCP
    port + 1 convention, used only where that port's /info names the TCP port given (another
    nsqd there, or a port forward, would answer for the wrong node). Every node's /info and the
    lookups are asked at once, by ``by``. Returns (addresses, problems)."""
    if nsqd_http:
        return nsqd_http, []
    from ...client import limits
    from ...client.fanout import ask_all
    from ...client.http import lookup_all
    from ...client.transport import split_address

    tcps = list(dict.fromkeys(conn.get("nsqd_tcp_addresses")
                              or (() if conn.get("lookupd_http_addresses") else ("127.0.0.1:4150",))))
    lookupds = list(conn.get("lookupd_http_addresses") or ())
    jobs = [("tcp", a) for a in tcps] + ([("lookup", None)] if lookupds else [])

    def ask(job):
        kind, tcp = job
        if kind == "lookup":
            return lookup_all(lookupds, topic, _left(by))
        return limits.http_address_of(tcp, by)

    out, problems = [], []
    # slack: lookup_all's own round (its hung nsqlookupd named) ends before this one does
    answers = ask_all(jobs, ask, _left(by), slack=0.6,
                      name=lambda job: f"nsqd {job[1]}" if job[1] else ", ".join(lookupds))
    for (kind, tcp), a in zip(jobs, answers):
        if kind == "lookup":
            producers, errors = a.value if a.ok else ([], [a.error])
            out += [p.http_address for p in producers]
            problems += [str(e) for e in errors]
        elif a.ok and a.value:
            out.append(a.value)
        else:
            try:
                host, port = split_address(tcp)
                guess = (f"[{host}]" if ":" in host else host) + f":{port + 1}"
                problems.append(f"nsqd {tcp}: its HTTP address is not known ({guess}, TCP port + 1, "
                                f"did not answer /info as the nsqd of TCP port {port})")
            except ValueError:
                problems.append(f"nsqd {tcp}: its HTTP address is not known")
    return list(dict.fromkeys(out)), problems


def _refuse_backlog(topic: str, conn: dict, nsqd_http: list[str], by: float) -> list[str]:
    """Refuse (exit 1) to subscribe an ephemeral channel to a topic that has a backlog and no
    channel: the first channel takes the whole backlog, an ephemeral one drops most of it.
    Returns what could not be checked."""
    from ...errors import NSQError

    addresses, problems = _http_addresses(topic, conn, nsqd_http, by)
    for address, a in zip(addresses, _stats_of(addresses, {"topic": topic}, _left(by))):
        if a.error is not None or not isinstance(a.value or {}, dict):
            problems.append(str(a.error) if a.error is not None else f"{address}: /stats is not a JSON object")
            continue
        for t in (a.value or {}).get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            depth = int(t.get("depth", 0))
            if depth > 0 and not t.get("channels"):
                raise NSQError(
                    f"topic {topic!r} on nsqd {address} has {depth} messages and no channel yet: the first channel "
                    "takes that backlog from every channel created later, and tail's ephemeral channel keeps "
                    "at most nsqd's --mem-queue-size of it. Read it durably with --channel NAME, or take "
                    "it anyway with --drain-backlog")
    return problems


def _warn_shared_channel(app, topic: str, channel: str, conn: dict, nsqd_http: list[str], by: float) -> None:
    """A durable channel that already has consumers: what tail shows (and FINs) they never get."""
    addresses, _ = _http_addresses(topic, conn, nsqd_http, by)
    others = 0
    for a in _stats_of(addresses, {"topic": topic, "channel": channel}, _left(by)):
        if a.error is not None or not isinstance(a.value, dict):
            continue
        for t in a.value.get("topics") or []:
            for c in t.get("channels") or []:
                if t.get("topic_name") == topic and c.get("channel_name") == channel:
                    others += int(c.get("client_count", 0))
    if others:
        app.warn(f"channel {topic}/{channel} has {others} other consumer(s): the messages tail shows are "
                 "FINed here and never reach them (leave out --channel for a copy of every message)")


def _stats_of(addresses: list[str], params: dict, timeout: float) -> list:
    """Every node's /stats (``params``) at once, in one round of ``timeout``: one Answer each."""
    from ...client.http import ask_http, http_json

    return ask_http(addresses, lambda a: http_json(a, "/stats", {"format": "json", **params}, timeout=timeout),
                    timeout)


def _waiting_reason(consumers, conn: dict) -> str | None:
    """What tail waits for when no nsqd is connected (None when something is connected)."""
    idle = [c for c in consumers if not c.stats()]
    if not idle:
        return None
    names = ", ".join(repr(c.topic) for c in idle)
    if conn.get("lookupd_http_addresses"):
        return (f"waiting for topic {names}: no nsqd carries it yet according to nsqlookupd "
                f"{', '.join(conn['lookupd_http_addresses'])} (asked every 5 s; it is read as soon as it is published)")
    return f"waiting for topic {names}: no nsqd connection yet (retrying {', '.join(nsqd_addresses(conn))})"


def _wait(done, sink, consumers, deadline, idle_timeout, live, app, conn, outages=None) -> bool:
    """Block until done; returns True when the hard --timeout (``deadline``) ended the run."""
    from ..app import sources_recovered

    said_waiting = False
    started = time.monotonic()
    view = None
    if live:
        if app.stderr_is_tty:
            from ..views import LiveConnections

            view = LiveConnections(app.console, consumers).start()
        else:
            app.warn("--live needs a terminal on stderr; ignoring it")
    try:
        while not done.wait(0.1):
            now = time.monotonic()
            if not said_waiting and now - started >= 3.0:
                said_waiting = True
                reason = _waiting_reason(consumers, conn)
                if reason:
                    app.info(reason)
            if deadline is not None and now >= deadline:
                return True
            if idle_timeout and now - sink.last_message >= idle_timeout:
                return False
            if outages is not None:
                sources_recovered(outages, consumers)
    finally:
        if view is not None:
            view.stop()
    return False
