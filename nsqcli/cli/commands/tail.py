"""``nsqcli tail``: consume topics and write message bodies to stdout."""

from __future__ import annotations

import random
import sys
import threading
import time

import click

from .. import topic_checks
from ..command import command, option
from ..harness import Job
from ..options import (build_config, connection_options, daemon_options, nsqd_addresses, pop_connection, pop_run,
                       topic_arguments)
from ..types import DURATION, HTTP_ADDRESS
from ...filters import WHERE_HELP
from ...records import FORMAT_HELP


def watches_reader(fd: int) -> bool:
    """stdout is a pipe or FIFO (`| head`), the one kind GNU `tail -f` watches too. Not a
    socket: its POLLERR is as often a real error (a reset, an ICMP refusal), said at the next
    write as it always was, and a closed TCP peer gives no POLLHUP anyway."""
    import os
    import stat

    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def reader_gone(fd: int) -> bool:
    """No reader is left on pipe ``fd`` (POLLERR on the write end; Linux gives a pipe's writer
    nothing else). Without this, `tail | head -n 3` whose every message was already in the pipe
    when head exited got no EPIPE and waited for a next message for ever. As with GNU `tail -f`,
    a FIFO whose reader closes and opens it again ends tail if a look falls between the two."""
    import select

    try:
        p = select.poll()
        p.register(fd, 0)  # no event asked for: only the error ones are reported
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (OSError, ValueError):
        return False


class Sink:
    """Writes formatted records to stdout for every consumer; counts toward -n across topics.
    A batch is written and flushed before its messages are FINed (auto-response).

    ``accept`` (--grep/--where): a message it refuses is not shown and not counted toward -n;
    it is FINed (counted in ``unmatched``), or with ``peek`` given back.

    ``peek`` (a :class:`~nsqcli.cli.peek.Peek`): nothing is FINed, every message goes back with
    REQ and no delay, paced per node; the peek ends when every node's backlog was looked at."""

    def __init__(self, formatter, separator: bytes, count: int, done: threading.Event,
                 accept=None, peek=None, terminal: bool = False):
        self.out = sys.stdout.buffer
        self.format = formatter
        if terminal:
            from ...records import terminal_safe

            self.format = lambda m: terminal_safe(formatter(m))
        self.sep = separator
        self.count = count
        self.shown = 0
        self.done = done
        self.accept = accept
        self.peek = peek
        self.unmatched = 0
        self.lock = threading.Lock()
        self.last_message = time.monotonic()
        self.error: BaseException | None = None
        # called when -n is done (or stdout closed), before anything is given back: the consumers
        # stop taking (RDY 0; Tail._stop_taking, which acts once). Given back while nsqd could
        # still send, a message came straight back, was given back again, and so on until the CLS
        self.on_done = None

    def _stop_taking(self) -> None:
        if self.on_done is not None:
            self.on_done()

    def reader_gone(self) -> None:
        """stdout's reader went away while nothing was being written (see :func:`reader_gone`):
        the end an EPIPE would have been at the next write."""
        import errno

        with self.lock:
            if self.error is None:
                self.error = BrokenPipeError(errno.EPIPE, "the reader of stdout is gone")
            self.done.set()
            self._stop_taking()

    def __call__(self, msgs: list) -> None:
        with self.lock:
            self.last_message = time.monotonic()
            peek = self.peek
            if peek is not None:
                for m in msgs:
                    m.auto_response = False  # never FINed: every one is given back
                msgs = peek.first_seen(msgs)
            give_back = peek.not_shown if peek is not None else (lambda m: m.requeue(delay=0, backoff=False))
            if self.done.is_set():
                keep, extra = [], msgs
            elif self.accept is not None:
                keep, extra = [], []
                accept, room = self.accept, (self.count - self.shown if self.count else None)
                for m in msgs:
                    if room is not None and len(keep) >= room:
                        extra.append(m)
                    elif accept(m):
                        keep.append(m)
                    else:
                        self.unmatched += 1
                        if peek is not None:
                            give_back(m)
                        # else: FINed by the auto-response, as tail does with what it shows
            elif self.count:
                room = self.count - self.shown
                keep, extra = msgs[:room], msgs[room:]
            else:
                keep, extra = msgs, []
            if self.done.is_set() or (peek is None and self.count and self.shown + len(keep) >= self.count):
                self._stop_taking()
            for m in extra:  # not shown: give it back at once, without backoff
                give_back(m)
            if keep:
                fmt, sep = self.format, self.sep
                try:
                    self.out.write(b"".join([fmt(m) + sep for m in keep]))
                    self.out.flush()
                except (BrokenPipeError, OSError) as e:  # `| head` closed the pipe: not shown
                    for m in keep:
                        give_back(m)
                    self.error = e
                    self.done.set()
                    keep = []
                self.shown += len(keep)
                if peek is not None:
                    peek.shown(keep)
            if (self.count and self.shown >= self.count) or (peek is not None and peek.wrapped):
                self.done.set()
            if self.done.is_set():
                self._stop_taking()
            if peek is not None and not self.done.is_set():
                peek.give_back_some()

    def give_back(self) -> None:
        """(peek) REQ, with no delay, what is still held."""
        with self.lock:
            self.peek.give_back()

    def add_backlog(self, topic: str, depths: dict) -> None:
        with self.lock:
            self.peek.add_backlog(topic, depths)

    def holds(self) -> bool:
        if self.peek is None:
            return False
        with self.lock:
            return bool(self.peek.held_and_pending())

    def touch_held(self) -> None:
        with self.lock:
            held = self.peek.held_and_pending()
        for m in held:
            try:
                m.touch()
            except Exception:
                pass


@command(examples="""
nsqcli tail events                            # bodies on stdout; a fresh ephemeral channel
nsqcli tail events clicks -n 100 -f json > sample.ndjson
nsqcli tail events -f '{time} {nsqd} {attempts} {body}' --timeout 10s -n 5
nsqcli tail events --live > /tmp/bodies.txt   # the connections table on the terminal
nsqcli tail events -c audit                   # a durable channel (takes from its other consumers)
nsqcli tail orders -c billing --peek -n 3     # look at billing's backlog without taking it
nsqcli tail orders -c billing --peek --where '.user.id == 42' -n 1
nsqcli tail events --grep 'timeout|refused' -f '{time} {size} {body_escaped}'
nsqcli tail -t events --lookupd-http-address 127.0.0.1:4161
nsqcli tail --topic-pattern '^orders\\.' --lookupd-http-address 127.0.0.1:4161
""")
@topic_arguments(many=True, channel="option", required=False, topic_help="Topic to tail (repeatable; or as arguments).",
                 channel_help="Channel (default: a new ephemeral one, so real consumers lose nothing).")
@option("--topic-pattern", metavar="REGEX", help="Tail every topic nsqlookupd knows whose name matches REGEX (Python "
        "re, searched), and those that appear later (needs --lookupd-http-address).")
@option("--topic-refresh", type=DURATION, default="5s", show_default=True,
        help="How often --topic-pattern asks nsqlookupd for new topics.")
@option("--max-in-flight", type=click.IntRange(1, 100000), default=200, show_default=True,
        help="Messages in flight per topic.")
@option("-f", "--format", "fmt", default="raw", show_default=True, help=FORMAT_HELP)
@option("--peek", is_flag=True, help="Look without taking: show messages of an existing --channel and give "
        "every message received back at once (REQ with no delay, to the back of the queue; never FIN). "
        "Their attempts rise by one. Ends at -n shown or when messages come round again (all looked at).")
@option("--grep", "grep", metavar="REGEX", help="Only messages whose body matches REGEX (RE2 syntax, as Go's "
        "regexp; searched in the body's bytes, in linear time). Others are FINed and counted (with --peek: given back); -n counts matches.")
@option("--where", "where", metavar="EXPR", help=WHERE_HELP)
@option("--raw-terminal", is_flag=True, help="Write bodies to a terminal as they are (default there: control "
        "characters such as ESC and BEL are shown as \\xNN escapes, so a body cannot retitle or reprogram it).")
@option("--print-topic", is_flag=True, help="raw format: prefix each body with 'topic | '.")
@option("-0", "--null", "null", is_flag=True, help="End records with NUL instead of newline.")
@option("--drain-backlog", is_flag=True, help="Subscribe an ephemeral channel even to a topic with a backlog "
        "and no channel yet (it takes the backlog and keeps only nsqd's --mem-queue-size of it).")
@option("--nsqd-http-address", "nsqd_http", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS",
        show_envvar=True, group="Connection",
        help="nsqd HTTP address for the backlog check (default: lookupd's answer, or the TCP port + 1).")
@daemon_options(count_help="Stop after N messages in total across topics (0 = no limit).", as_json=False,
                status_interval="0", live_help="Live table of the connections on stderr (default: when stderr is "
                "a terminal that can draw one and stdout goes elsewhere).")
@connection_options(consumer=True)
@click.pass_obj
def tail(app, topics, channel, max_in_flight, count, fmt, print_topic, null, drain_backlog, nsqd_http, peek, grep,
         where, raw_terminal, topic_pattern, topic_refresh, **kwargs):
    """Consume TOPIC(s) and write each message body to stdout.

    Every message shown is FINed; with -n the rest are requeued at once. Ctrl-C, SIGTERM, SIGHUP or a
    closed stdout pipe stop cleanly with exit 0. With --peek nothing is FINed: every message received
    goes back to the channel at once.

    --where is a small expression language of its own (jq's paths into the JSON body, comparisons,
    and/or/not): an expression from a command line must not be able to run code, as Python's eval
    would let it.

    Before subscribing an ephemeral channel to a topic that has a backlog and no channel yet,
    tail refuses (exit 1): the first channel of a topic receives its whole backlog, and an
    ephemeral one would keep only --mem-queue-size of it and drop the rest for every
    channel created later. Use --channel NAME, or --drain-backlog to go ahead.
    """
    settings = pop_run(kwargs)
    conn = pop_connection(kwargs)
    topics, pattern = _topics_or_pattern(tuple(topics), topic_pattern, topic_refresh, conn)
    formatter, accept = _output(fmt, print_topic, grep, where)
    if peek and (channel is None or channel.endswith("#ephemeral")):
        raise click.UsageError("--peek looks at the backlog of an existing channel: give it with -c CHANNEL "
                               "(a new or ephemeral channel has nothing to peek at)")
    _live_or_messages(app, settings)
    deadline = settings.deadline
    # the pre-checks (backlog, shared channel) of every topic share one budget: 3 s, or what is
    # left of --timeout; a hung nsqlookupd or nsqd costs that once, not once per topic and stage
    check_by = time.monotonic() + 3.0 if deadline is None else min(time.monotonic() + 3.0, deadline)
    if count and count < max_in_flight:
        max_in_flight = count
    if channel is None:
        channel = f"nsqcli_tail{random.randrange(1_000_000):06d}#ephemeral"
    nsqd_http = list(nsqd_http)
    topics, backlogs = _ask_before_subscribing(app, topics, pattern, channel, peek, conn, nsqd_http, check_by)
    rdy_total = max_in_flight
    if peek and topics:
        # a node whose backlog was looked at holds what comes round again there (in flight, so
        # it never runs dry): with fewer RDY than nodes it would keep its RDY and the other
        # nodes' backlogs would never be sent. One RDY per node at least.
        rdy_total = max(max_in_flight, max(len(backlogs[t]) for t in topics))
    cfg = build_config(conn, max_in_flight=rdy_total, max_attempts=0)
    unchecked = {}  # topic -> why its backlog could not be checked (said once it is connected)
    if channel.endswith("#ephemeral") and not drain_backlog:
        for topic in topics:
            unchecked[topic] = topic_checks.refuse_backlog(topic, conn, nsqd_http, check_by)
    if deadline is not None and time.monotonic() >= deadline:
        _passed_before_subscribing(unchecked)
    book = _peek_book(count, max_in_flight, topics, backlogs) if peek else None
    sink = Sink(formatter, b"\0" if null else b"\n", count, None, accept=accept, peek=book,
                terminal=not raw_terminal and sys.stdout.isatty())
    job = Tail(app, topics, channel, conn, cfg, sink, unchecked)
    if peek:
        for topic in topics:
            job.peek_at(topic, backlogs[topic])
    if pattern is not None:
        job.discovery = (pattern, topic_refresh, dict(peek=peek, drain_backlog=drain_backlog, nsqd_http=nsqd_http))
    from ..harness import run

    return run(app, job, settings)


def _passed_before_subscribing(unchecked: dict):
    from ..app import DeadlineExceeded

    raise DeadlineExceeded("--timeout passed while asking nsqd/nsqlookupd about the topics, before subscribing "
                           f"({'; '.join(p for ps in unchecked.values() for p in ps) or 'no answer in time'})")


def _peek_book(count: int, max_in_flight: int, topics, backlogs: dict):
    """(--peek) the book of what was looked at, with every topic's backlog per node."""
    from ..peek import Peek

    book = Peek(count, max_in_flight)
    for topic in topics:
        book.add_backlog(topic, backlogs[topic])
    return book


def _topics_or_pattern(topics: tuple, topic_pattern, topic_refresh, conn: dict):
    """(usage) TOPIC(s) or --topic-pattern, not both and not neither: (topics, compiled pattern or None)."""
    if topic_pattern is None:
        if not topics:
            raise click.UsageError("missing TOPIC (nsqcli tail TOPIC..., or -t TOPIC), or --topic-pattern REGEX")
        return topics, None
    import re

    if topics:
        raise click.UsageError("TOPIC and --topic-pattern cannot be used together (a pattern already chooses "
                               "the topics)")
    if not conn.get("lookupd_http_addresses"):
        raise click.UsageError("--topic-pattern needs --lookupd-http-address (nsqlookupd knows the topics)")
    try:
        pattern = re.compile(topic_pattern)
    except re.error as e:
        raise click.BadParameter(f"invalid regular expression {topic_pattern!r}: {e}",
                                 param_hint="'--topic-pattern'") from None
    if topic_refresh <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--topic-refresh'")
    return topics, pattern


def _output(fmt: str, print_topic: bool, grep, where):
    """(usage) --format, --print-topic, --grep/--where: (formatter, accept or None)."""
    from ...filters import FilterError, make_filter
    from ...records import Formatter

    try:
        formatter = Formatter(fmt, print_topic)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--format'") from None
    if print_topic and fmt != "raw":
        raise click.UsageError("--print-topic goes with --format raw (a template can use {topic})")
    try:
        accept = make_filter(grep, where)
    except FilterError as e:
        raise click.BadParameter(str(e), param_hint=f"'{e.option}'") from None
    return formatter, accept


def _live_or_messages(app, settings) -> None:
    """(usage) --live and the messages cannot share one terminal; without --live there the messages have it."""
    same_terminal = app.stderr_is_tty and sys.stdout.isatty() and _same_terminal()
    if settings.live and same_terminal:
        raise click.UsageError("--live draws on the terminal that also gets the messages: redirect stdout "
                               "(nsqcli tail TOPIC --live > FILE) or leave out --live")
    if same_terminal:
        settings.live = False  # the messages have the terminal


def _ask_before_subscribing(app, topics, pattern, channel, peek, conn, nsqd_http, check_by):
    """--topic-pattern's topics; with --peek each topic's backlog per node (a pattern keeps only the topics
    that have the channel); a durable channel's other consumers are warned about. (topics, backlogs)."""
    backlogs = {}
    if pattern is not None:
        topics = topic_checks.matching_topics(conn, pattern, check_by)
    if pattern is not None and peek:
        asked = {t: topic_checks.channel_depth(t, channel, conn, nsqd_http, check_by) for t in topics}
        backlogs = {t: depths for t, (_, depths) in asked.items()}
        topics = tuple(t for t in topics if backlogs[t] is not None)  # a topic without the channel: not peeked
        for t in topics:
            topic_checks.warn_not_counted(app, t, asked[t][0])
    elif peek:
        for topic in topics:
            backlogs[topic], problems = topic_checks.require_channel(topic, channel, conn, nsqd_http, check_by)
            topic_checks.warn_not_counted(app, topic, problems)
    elif not channel.endswith("#ephemeral"):
        for topic in topics:
            topic_checks.warn_shared_channel(app, topic, channel, conn, nsqd_http, check_by)
    return topics, backlogs


class Tail(Job):
    name = "tail"

    def __init__(self, app, topics, channel, conn, cfg, sink: Sink, unchecked: dict):
        super().__init__()
        from ..app import Outages

        self.app, self.topics, self.channel, self.conn, self.cfg = app, topics, channel, conn, cfg
        self.sink, self.unchecked = sink, unchecked
        sink.done, sink.on_done = self.done, self._stop_taking
        self.outages = Outages(app)  # said when it starts, counted while it lasts, "recovered" when it ends
        self._consumers: list = []
        self._made: list = []  # every consumer made, started or not
        self._taking = True  # False once -n is done: every consumer at RDY 0
        self._said_waiting = False
        self._next_touch = 0.0  # peek: when what it holds is TOUCHed next
        try:  # stdout a pipe: looked at every tick for its reader gone
            fd = sink.out.fileno()
            self._watch_reader = fd if watches_reader(fd) else None
        except (AttributeError, OSError, ValueError):  # in-process (CliRunner): no descriptor
            self._watch_reader = None
        self.discovery = None  # --topic-pattern: (pattern, refresh, checks)
        self._lock = threading.Lock()
        self._finder: threading.Thread | None = None
        self._refused: set[str] = set()
        self._peek_nodes: dict = {}  # --peek: topic -> the nsqd TCP addresses that have the channel

    def _stop_taking(self) -> None:
        """-n is done: no consumer takes more (RDY 0), started or still starting; one made
        later is cut as it is made (_subscribe). Once: the sink calls it for every batch after."""
        with self._lock:
            if not self._taking:
                return
            self._taking = False
            made = list(self._made)
        for c in made:
            c.set_max_in_flight(0)

    def peek_at(self, topic: str, depths: dict) -> None:
        """--peek connects only to the nodes that have the channel: subscribing elsewhere would
        create it there (a durable channel that keeps a copy of every message from then on, and
        takes the topic's backlog there). Not when a node's address is not known (None)."""
        if depths and None not in depths:
            self._peek_nodes[topic] = list(depths)

    def _subscribe(self, topic: str, deadline) -> None:
        from ...client.consumer import Consumer
        from ..app import source_error

        peek_nodes = self._peek_nodes.get(topic)
        c = Consumer(topic, self.channel, batch_handler=self.sink, config=self.cfg,
                     on_error=lambda err: source_error(self.outages, err),
                     nsqd_tcp_addresses=peek_nodes or nsqd_addresses(self.conn),
                     lookupd_http_addresses=[] if peek_nodes else list(self.conn.get("lookupd_http_addresses") or ()))
        with self._lock:  # its messages may reach the sink, and -n be done, before start returns
            self._made.append(c)
            taking = self._taking
        if not taking:
            c.set_max_in_flight(0)
        self.start_consumer(c, deadline, self._consumers, self._lock)
        if self.unchecked.get(topic) and c.stats():
            self.app.warn(f"could not check topic {topic!r} for a backlog without channels "
                          f"({'; '.join(self.unchecked[topic])}); if it had one, this ephemeral channel took "
                          "it and keeps only nsqd's --mem-queue-size of it (give --nsqd-http-address to check)")

    def _find_topics(self) -> None:
        """(own thread) --topic-pattern: every refresh, tail the new topics that match."""
        from ...errors import NSQError

        pattern, refresh, checks = self.discovery
        while not self.done.wait(refresh):
            try:
                found = topic_checks.matching_topics(self.conn, pattern, time.monotonic() + min(refresh, 5.0),
                                                     cancel=self.done.is_set)  # a stop ends the round
            except NSQError as e:
                self.app.debug(str(e))
                continue
            for topic in found:
                if self.done.is_set():
                    return
                if topic in self.topics or topic in self._refused:
                    continue
                if not self._may_tail(topic, checks):
                    self._refused.add(topic)
                    continue
                self.topics = self.topics + (topic,)
                self.app.info(f"tailing topic {topic} (matches --topic-pattern)")
                try:
                    self._subscribe(topic, time.monotonic() + 5.0)
                except NSQError as e:
                    self.app.warn(f"topic {topic}: {e}")

    def _may_tail(self, topic: str, checks: dict) -> bool:
        """The start-up checks, for a topic that appeared later: said and skipped instead of exit 1."""
        from ...errors import NSQError

        by = time.monotonic() + 3.0
        if checks["peek"]:
            problems, depths = topic_checks.channel_depth(topic, self.channel, self.conn, checks["nsqd_http"], by)
            if depths is None:
                self.app.debug(f"topic {topic}: no channel {self.channel} to peek at ({'; '.join(problems)})")
                return False
            self.sink.add_backlog(topic, depths)
            self.peek_at(topic, depths)
        elif self.channel.endswith("#ephemeral") and not checks["drain_backlog"]:
            try:
                self.unchecked[topic] = topic_checks.refuse_backlog(topic, self.conn, checks["nsqd_http"], by)
            except NSQError as e:
                self.app.warn(f"not tailing topic {topic}: {e}")
                return False
        else:
            topic_checks.warn_shared_channel(self.app, topic, self.channel, self.conn, checks["nsqd_http"], by)
        return True

    def consumers(self) -> list:
        with self._lock:
            return list(self._consumers)

    def start(self, deadline, stopper) -> None:
        for topic in self.topics:
            if self.done.is_set():
                break
            self._subscribe(topic, deadline)
        self.app.debug(f"tailing {', '.join(self.topics)} on channel {self.channel}")
        if self.discovery is not None:
            pattern, refresh, _ = self.discovery
            if not self.topics and not self.done.is_set():
                self.app.info(f"waiting for a topic matching {pattern.pattern!r}: nsqlookupd "
                              f"{', '.join(self.conn['lookupd_http_addresses'])} knows none yet (asked every "
                              f"{refresh:g} s)")
            self._finder = threading.Thread(target=self._find_topics, name="nsqcli-topics", daemon=True)
            self._finder.start()

    def tick(self, now: float) -> None:
        if self._watch_reader is not None and reader_gone(self._watch_reader):  # `| head` has gone: the end
            self.sink.reader_gone()
            return
        if self.sink.holds() and now >= self._next_touch:  # peek: TOUCH what it holds
            timeouts = [t for c in self.consumers() for t in c.msg_timeouts()]
            self._next_touch = now + max(0.5, min([20.0] + [t / 3 for t in timeouts]))
            self.sink.touch_held()
        if not self._said_waiting and now - self.started >= 3.0:
            self._said_waiting = True
            reason = _waiting_reason(self.consumers(), self.conn)
            if reason:
                self.app.info(reason)

    def last_progress(self) -> float:
        return self.sink.last_message

    def live_view(self, console):
        from ..views import LiveConnections

        return LiveConnections(console, self.consumers())

    def stop(self, end) -> None:
        # a clean stop (FINs out, CLS answered) takes milliseconds on healthy nodes; past the
        # deadline a hung one is given what is left of the grace (what it holds in flight it redelivers)
        def grace():
            return 10.0 if end is None else min(10.0, max(0.1, end - time.monotonic()))

        if self._finder is not None:  # no new topic from here on (done is set)
            self.interrupt()  # a topic the finder is starting ends its lookups and handshakes now
            self._finder.join(grace())
        consumers = self.consumers()
        if self.sink.peek is not None:  # CLS first (nsqd sends no more), then what is held goes back
            for c in consumers:
                c.drain(timeout=grace())
            self.sink.give_back()
        for c in consumers:
            c.stop(timeout=grace())

    def status_lines(self, elapsed: float) -> list[str]:
        return [f"shown {self.sink.shown:,}, {self.sink.shown / max(elapsed, 1e-9):,.0f} msg/s"]

    def counters(self) -> dict:
        out = {"shown": self.sink.shown}
        if self.sink.accept is not None:
            out["unmatched"] = self.sink.unmatched
        return out

    def finish(self, elapsed, expired, settings, app) -> None:
        from ..app import DeadlineExceeded

        sink = self.sink
        self.outages.say_still_failing()
        if sink.error is None:
            sys.stdout.flush()
        elif not isinstance(sink.error, BrokenPipeError):  # e.g. ENOSPC: what was shown is not durable
            raise OSError(sink.error.errno, f"cannot write to stdout: {sink.error.strerror or sink.error}; "
                          f"{sink.shown} messages were written and FINed, the rest were requeued")
        for c in self.consumers():
            t = c.totals()
            if t["timed_out"] or t["lost_responses"] or t["late_messages"]:
                app.warn(f"topic {c.topic}: {t['timed_out']} answers came after nsqd's message timeout, "
                         f"{t['lost_responses']} could not be sent (connection gone), {t['late_messages']} "
                         "messages arrived after close - nsqd redelivers those")
        peek = sink.peek
        if peek is not None:
            looked, again_n, backlog = peek.looked, peek.again, peek.backlog
            again = (f"; {again_n} deliveries were of messages already looked at, given back again (each "
                     "raised its attempts once more)" if again_n else "")
            lost = looked + again_n - peek.given_back
            if lost > 0:
                again += (f"; {lost} could not be given back (connection gone): nsqd gives them back after "
                          "its message timeout")
            app.info(f"peek: the {looked} message(s) looked at were given back (REQ, no delay), not FINed: "
                     f"their attempts rose by one{again}"
                     + (f"; {sink.unmatched} did not match" if sink.accept is not None else "")
                     + (" (every message waiting was looked at)" if peek.wrapped and not peek.partial
                        and sink.count and sink.shown < sink.count else ""))
            if peek.partial:
                app.warn(f"peek stopped after looking at {looked} of the {backlog} messages waiting: "
                         "part of the backlog is on nsqd's disk (beyond its --mem-queue-size), which nsqd sends "
                         "mixed at random with the messages given back, so as many came round again as were new")
            elif backlog and looked < backlog and not (sink.count and sink.shown >= sink.count):
                if expired:  # the work (the whole backlog) was not done: exit 3
                    raise DeadlineExceeded(f"--timeout passed after looking at {looked} of the {backlog} messages "
                                           "waiting when the peek started; the channel is as it was")
                app.warn(f"peek looked at {looked} of the {backlog} messages waiting when it started (it was "
                         "stopped before the rest came); the channel is as it was")
        elif sink.accept is not None and sink.unmatched:
            app.info(f"{sink.unmatched} message(s) did not match and were FINed")
        if peek is not None and peek.wrapped:
            return
        if expired and sink.count and sink.shown < sink.count:
            raise DeadlineExceeded(f"--timeout passed after {sink.shown} of {sink.count} messages")


def _same_terminal() -> bool:
    import os

    try:
        a, b = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino, a.st_rdev) == (b.st_dev, b.st_ino, b.st_rdev)


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
