"""``nsqcli mpub``: publish many records from files or stdin, in pipelined MPUB batches."""

from __future__ import annotations

import collections
import sys
import time

import click

from ..command import command, option
from ..delimited import read_groups
from ..options import build_config, connection_options, pop_connection, resolve_producers, topic_arguments
from ..types import DELIMITER, DURATION, RATE


class Tally:
    def __init__(self):
        self.records = self.published = self.skipped_empty = self.skipped_invalid = self.bytes = 0
        self.handled = 0  # records from the start of the input that are published or skipped
        self.start = time.monotonic()

    def summary(self, failed: int, stopped: bool = False, unsent: int = 0) -> str:
        """``failed``: records read and not acknowledged; ``unsent``: of those, the ones a stop
        (a signal, --timeout) came before they were written (never sent: not failures); after a
        stop, the input past the last record read was not read at all (and is not counted)."""
        dt = max(time.monotonic() - self.start, 1e-9)
        rest = f" (input not read past record {self.records})" if stopped else ""
        not_sent = f", not sent {unsent}" if unsent else ""
        return (f"published {self.published}, skipped {self.skipped_empty} empty"
                f"{f' + {self.skipped_invalid} invalid' if self.skipped_invalid else ''}, failed {failed - unsent}"
                f"{not_sent}{rest}, {dt:.2f}s, {self.published / dt:,.0f} msg/s")


class RecordNumbers:
    """The record number (1-based, in the input) of each message handed to the producer, by
    its message number there (0-based, in the order handed: the numbering of the producer's
    ledger, nsqcli.client.ledger), kept as runs of consecutive records - a chunk of records is
    one run. What is acknowledged, sent or unanswered the ledger says; this only names records.
    Runs wholly acknowledged are forgotten (:meth:`forget_before`): memory stays bounded."""

    def __init__(self):
        self.runs: collections.deque[list[int]] = collections.deque()  # [first message, first record, count]

    def add(self, message: int, record: int, count: int) -> None:
        """Messages ``message``... (``count`` of them) are records ``record``...; messages are
        added in order."""
        runs = self.runs
        if runs:
            last = runs[-1]
            if last[0] + last[2] == message and last[1] + last[2] == record:
                last[2] += count
                return
        runs.append([message, record, count])

    def record(self, message: int) -> int:
        """The record number of ``message`` (added, not forgotten; else IndexError)."""
        for first, record, count in self.runs:
            if message < first:
                break
            if message < first + count:
                return record + message - first
        raise IndexError(message)

    def forget_before(self, message: int) -> None:
        """Messages before ``message`` are acknowledged: no record of theirs is asked again."""
        runs = self.runs
        while runs and runs[0][0] + runs[0][2] <= message:
            runs.popleft()


DEFAULT_MAX_MSG_SIZE = 1024 * 1024   # nsqd's default --max-msg-size
UNKNOWN_MAX_MSG_SIZE = (1 << 31) - 1  # MPUB's size field: no local check, nsqd decides


def _nsqd_max_message(addresses: list[str], deadline: float | None) -> int | None:
    """The largest message every nsqd of ``addresses`` accepts (its /config: --max-msg-size,
    within --max-body-size), or None when none of them could be asked."""
    from ...client import limits

    found = limits.ask(addresses, timeout=limits.ASK_TIMEOUT, deadline=deadline)
    sizes = [lim.max_message for lim in found.values() if lim.max_message is not None]
    return min(sizes) if sizes else None


class BodyReader:
    """The records to publish, with what makes the resume hint exact: the record number of
    every body handed to the producer (:class:`RecordNumbers`) and how many of them its ledger
    acknowledged (``on_progress``)."""

    def __init__(self, app, sources, delimiter: bytes, fmt: str, skip: int, skip_invalid: bool,
                 max_msg_size: int | None, stats: Tally, ask_limit=None):
        self.app, self.sources, self.delimiter, self.fmt = app, sources, delimiter, fmt
        self.skip, self.skip_invalid, self.stats = skip, skip_invalid, stats
        # --max-msg-size, else nsqd's: its default until a record is larger, then asked of
        # nsqd's /config once (``ask_limit``: the limit, or None when it cannot be asked - then
        # nsqd decides, and its refusal names its limit)
        self.max_msg_size = max_msg_size or DEFAULT_MAX_MSG_SIZE
        self.limit_name = "--max-msg-size" if max_msg_size else "nsqd's default --max-msg-size"
        self.ask_limit = None if max_msg_size else ask_limit
        self.unchecked: dict[int, int] = {}  # record -> size: over nsqd's default, its limit unknown
        self.numbers = RecordNumbers()
        self.acked = 0  # the producer's ledger: the first ``acked`` messages are acknowledged
        self.last_done = 0  # the last record skipped or handed to the producer
        self.listeners: list = []
        self.limit = 0  # -n: stop after this many bodies
        self.given = 0  # bodies handed to the producer (its messages 0 .. given - 1)
        self.blocking = None  # GracefulStop.blocking: reads a signal may interrupt
        self.linger: float | None = None  # --linger: a partial batch waits at most this long for more input

    def __iter__(self):
        """Lists of bodies (one per chunk read; a list holding anything to skip, check or
        convert goes record by record instead) and the producer's FLUSH."""
        from ...client.publish_iter import FLUSH

        stats = self.stats
        raw = self.fmt == "raw"
        for src in self.sources:
            for group in read_groups(src, self.delimiter, self.blocking, self.linger):
                if group is FLUSH:
                    yield group
                    continue
                n = len(group)
                if stats.records + n <= self.skip:  # all of it before --skip
                    stats.records += n
                    stats.handled = self.last_done = stats.records
                    continue
                if (raw and stats.records >= self.skip and (not self.limit or self.given + n <= self.limit)
                        and b"" not in group and max(map(len, group)) <= min(self.max_msg_size, DEFAULT_MAX_MSG_SIZE)):
                    self.numbers.add(self.given, stats.records + 1, n)
                    stats.records += n
                    stats.bytes += sum(map(len, group))
                    self.last_done = stats.records
                    self.given += n
                    yield group
                else:
                    yield from self._each(group)
                if self.limit and self.given >= self.limit:  # not one more read (a pipe may wait long)
                    return

    def _each(self, group):
        from ...records import envelope_body

        stats = self.stats
        for rec in group:
            stats.records += 1
            if stats.records <= self.skip:
                stats.handled = self.last_done = stats.records
                continue
            if self.fmt == "json" and rec:
                try:
                    rec = envelope_body(rec)
                except (ValueError, KeyError, TypeError) as e:
                    self._invalid(f"is not a JSON envelope ({e})")
                    continue
            if not rec:
                stats.skipped_empty += 1
                self._handled()
                continue
            if len(rec) > self.max_msg_size and self.ask_limit is not None:
                self._learn_limit()
            if len(rec) > self.max_msg_size:
                self._invalid(f"is {len(rec)} bytes, over {self.limit_name} {self.max_msg_size}")
                continue
            if len(rec) > DEFAULT_MAX_MSG_SIZE and self.max_msg_size == UNKNOWN_MAX_MSG_SIZE:
                self.unchecked[stats.records] = len(rec)
            stats.bytes += len(rec)
            self.numbers.add(self.given, stats.records, 1)
            self.last_done = stats.records
            self.given += 1
            yield rec
            if self.limit and self.given >= self.limit:
                return

    def _handled(self) -> None:
        self.last_done = self.stats.records
        if not self.outstanding:
            self.stats.handled = self.stats.records

    def _learn_limit(self) -> None:
        ask, self.ask_limit = self.ask_limit, None
        limit = ask()
        if limit is None:  # nsqd's limit could not be asked: nsqd decides
            self.max_msg_size = UNKNOWN_MAX_MSG_SIZE
        else:
            self.max_msg_size, self.limit_name = limit, "nsqd's --max-msg-size"

    def _invalid(self, reason: str) -> None:
        from ...errors import NSQError

        if not self.skip_invalid:
            err = NSQError(f"record {self.stats.records} {reason}: stopped (--skip-invalid leaves such "
                           "records out)")
            err.record = self.stats.records
            raise err
        self.app.warn(f"skipping record {self.stats.records}: {reason}")
        self.stats.skipped_invalid += 1
        self._handled()

    def on_progress(self, acked: int) -> None:
        """The producer says the first ``acked`` bodies are acknowledged."""
        stats = self.stats
        if acked > self.acked:
            stats.handled = self.numbers.record(acked - 1)
            # counted before the runs are forgotten: a forced exit's handler may run in between
            # (mpub._forced_lines) and looks up the first unacknowledged one
            self.acked = stats.published = acked
            self.numbers.forget_before(acked)
        stats.published = acked
        if not self.outstanding:
            stats.handled = max(stats.handled, self.last_done)
        for listener in self.listeners:
            listener()

    @property
    def outstanding(self) -> int:
        """Bodies handed to the producer and not acknowledged."""
        return self.given - self.acked

    @property
    def resume_at(self) -> int:
        """The --skip that resumes without loss: every record up to it is acknowledged (those
        after it that nsqd may hold unanswered are sent again: see :meth:`where`)."""
        return self.numbers.record(self.acked) - 1 if self.outstanding else self.stats.handled

    def unanswered_range(self, unanswered: int) -> tuple[int, int] | None:
        """The first and last record numbers of the ``unanswered`` bodies after the
        acknowledged ones (written to nsqd, no answer: it may hold them)."""
        n = min(unanswered, self.outstanding)
        if n <= 0:
            return None
        return self.numbers.record(self.acked), self.numbers.record(self.acked + n - 1)

    def where(self, unanswered: int = 0) -> str:
        """The resume line: what nsqd acknowledged, what it may hold besides, the --skip."""
        line = f"nsqd acknowledged {self.stats.published} records in this run"
        span = self.unanswered_range(unanswered)
        if span is None:
            return f"{line}; resume with --skip {self.resume_at}"
        n = min(unanswered, self.outstanding)
        first, last = span
        records = f"record {first}" if first == last else f"records {first}-{last}"
        big = next((r for r in sorted(self.unchecked) if first <= r <= last), None)
        hint = "" if big is None else (
            f"; record {big} is {self.unchecked[big]} bytes, over nsqd's default --max-msg-size "
            f"({DEFAULT_MAX_MSG_SIZE}) and nsqd's own limit could not be asked: nsqd may have refused it and "
            f"closed the connection before its answer was read (--max-msg-size checks records here; --skip "
            f"{big} leaves it out)")
        return (f"{line}; up to {n} more ({records}) were written and got no answer: nsqd may hold them; "
                f"resume with --skip {self.resume_at} (nothing lost; at-least-once: up to {n} duplicate"
                f"{'s' * (n != 1)}){hint}")


def _publish_deferred(producer, topic, records, defer, rate, stop, timeout=10.0):
    """DPUB one by one (nsqd has no deferred MPUB), paced like publish_iter."""
    from ...client.future import Stopped
    from ...client.publish_iter import FLUSH, Pacer
    from ...errors import PublishError, ServerError

    pacer, done = Pacer(rate) if rate else None, 0
    written = [False]  # the DPUB in progress was written (Producer.on_publish) and not answered

    def on_publish(address, state):
        written[0] = state == "sent"

    producer.on_publish = on_publish
    try:
        for item in records:
            if item is FLUSH:  # one by one: nothing waits to be sent
                continue
            for body in item if type(item) is list else (item,):
                if stop.is_set():
                    raise Stopped()
                if pacer is not None:
                    pacer.wait(1)
                producer.publish(topic, body, defer=defer, timeout=timeout)
                done += 1
                records.on_progress(done)
    except BaseException as e:
        cause = e.cause if isinstance(e, PublishError) and e.cause is not None else e
        if isinstance(cause, ServerError) and written[0]:  # nsqd's answer to this DPUB, not to a handshake
            cause.index = done + 1
        err = PublishError(str(cause), done, 0, cause)
        # the DPUB being waited for may be in nsqd: no answer, or the connection lost after it
        err.unanswered = int(written[0] and not isinstance(cause, ServerError)
                             and getattr(cause, "not_processed", False) is not True)
        raise err from e


@command(examples="""
nsqcli mpub -t events records.txt              # one message per line, pipelined MPUB batches
seq 1000000 | nsqcli mpub -t numbers --json    # summary as JSON on stdout
nsqcli mpub -t events -0 < nul-separated.bin
nsqcli tail events -f json -n 100 | nsqcli mpub -t events-copy -f json   # exact copy, binary too
nsqcli mpub -t events big.txt --rate 500       # at most 500 messages a second
nsqcli mpub -t events big.txt --skip 41000     # resume where an interrupted run said
""")
@topic_arguments(topic_help="Topic to publish to (or the first argument).", rest="files", rest_metavar="[FILE]...",
                 rest_type=click.File("rb"))
@option("-d", "--delimiter", type=DELIMITER, default="\\n", show_default=True,
              help="Record separator: one byte or an escape (\\n, \\0, \\t, \\x1e).")
@option("-0", "--null", is_flag=True, help="Records are separated by NUL (same as -d '\\0').")
@option("-n", "--count", type=click.IntRange(1), help="Publish at most this many records (after --skip).")
@option("--json", "as_json", is_flag=True, help="The summary as one JSON line on stdout.")
@option("-f", "--format", "fmt", type=click.Choice(["raw", "json"]), default="raw", show_default=True,
              help="json: each record is the NDJSON envelope written by 'tail --format json'.")
@option("--batch-size", type=click.IntRange(1, 100000), default=500, show_default=True,
              help="Messages per MPUB (also bounded by --max-body-size).")
@option("--linger", type=DURATION, default="50ms", show_default=True,
              help="Send a batch that is not full once its first record has waited this long "
                   "(records from a slow pipe like 'tail -F' arrive within it; like kcat's "
                   "queue.buffering.max.ms). 0: send what was read at once.")
@option("--rate", type=RATE, help="At most N messages per second.")
@option("--defer", type=DURATION, help="Deliver each message after this delay (DPUB per message).")
@option("--skip-invalid", is_flag=True,
              help="Skip (and count) records over --max-msg-size or unparsable JSON instead of stopping.")
@option("--skip", type=click.IntRange(0), default=0,
              help="Skip the first N records (to resume after a failed run: it says which N).")
@option("--max-msg-size", type=click.IntRange(1), default=None,
              help="Larger records are invalid. Default: nsqd's --max-msg-size, asked of its /config when a "
                   "record is over nsqd's default (1 MiB); where it cannot be asked, nsqd decides.")
@option("--max-body-size", type=click.IntRange(1), default=5 * 1024 * 1024, show_default=True,
              help="nsqd's --max-body-size; MPUB batches stay below it.")
@option("--timeout", type=DURATION,
              help="Stop (exit 3) if the run is not done by then, counted from start (lookups and handshakes "
                   "included); it says how many nsqd acknowledged and the --skip that resumes. Default: none.")
@connection_options()
@click.pass_obj
def mpub(app, topic, rest, delimiter, null, count, as_json, fmt, batch_size, linger, rate, defer, skip_invalid, skip,
         max_msg_size, max_body_size, timeout, **kwargs):
    """Publish every record of FILES (or stdin) to TOPIC.

    Prints a summary on stderr: published, skipped, failed, elapsed, rate. Exit 0 only when
    every record was published (nsqd said OK to every batch); otherwise exit 1 (3: --timeout
    passed; 130/143/129: SIGINT/SIGTERM/SIGHUP) saying how many nsqd acknowledged, how many more it may
    hold unanswered (written when the connection was lost or stalled), and the --skip that
    resumes without loss.
    """
    # kept in one piece, longer than most: the run's steps in their order - signals end the
    # lookup, the deadline's alarm is set after it, the producer closed in `finally` however the
    # publish ended
    from ...client.producer import Producer, Stopped
    from ...errors import PublishError
    from ..app import Interrupted
    from ..options import check_timeout, deadline_of
    from ..signals import GracefulStop

    check_timeout(timeout)

    conn = pop_connection(kwargs)
    # the producer checks no size of its own unless told one: BodyReader applies the limit
    cfg = build_config(conn, max_msg_size=max_msg_size or UNKNOWN_MAX_MSG_SIZE, max_body_size=max_body_size)
    delimiter = _delimiter(null, delimiter)
    sources = list(rest) or [sys.stdin.buffer]
    stats = Tally()
    records = BodyReader(app, sources, delimiter, fmt, skip, skip_invalid, max_msg_size, stats,
                      ask_limit=lambda: _nsqd_max_message(addresses, deadline))
    records.limit = count or 0
    records.linger = linger
    deadline = deadline_of(timeout)
    stopper = GracefulStop().install()
    try:
        # a lookupd that never answers: SIGINT/SIGTERM end the wait (130/143); it keeps the deadline itself
        addresses = stopper.call(lambda: _producers(app, conn, topic, deadline), "nsqcli-lookup")
    except Interrupted as e:
        _fail(app, e, topic, stats, records, stopper, as_json, deadline)
    stopper.alarm(deadline)  # from here a passing --timeout stops the run as a signal does
    producer = Producer(addresses, cfg, deadline=deadline)
    producer.stop = stopper.event  # a wait for nsqd's answer ends when a signal (or the deadline) stops the run
    progress = _Progress(app, stats, sources) if app.stderr_is_tty else None
    if progress:
        records.listeners.append(progress.update)
    records.blocking = stopper.blocking  # os.read and select: one C call each
    producer.connecting = stopper.call  # a handshake nsqd never answers: a signal ends the wait
    stopper.on_force = lambda: _forced_lines(stats, records, producer)
    result = None
    stopped = False
    try:
        if defer is not None:
            _publish_deferred(producer, topic, records, defer, rate, stopper.event)
        else:
            result = producer.publish_iter(topic, records, batch_size=batch_size, window=8, rate=rate,
                                           on_progress=records.on_progress, stop=stopper.event)
        stopper.alarm(None)
        if progress:
            progress.finish()
    except (PublishError, Interrupted, Stopped) as e:
        stopper.alarm(None)
        stopped = True
        if progress:
            progress.stop()
            progress = None
        _fail(app, e, topic, stats, records, stopper, as_json, deadline)
    finally:
        stopper.alarm(None)
        if progress:
            progress.stop()
        # after a stop the answers still missing are given up on (the line said nsqd may hold them)
        producer.close(0.0 if stopped or stopper.stopping else 10.0)
    resent = result.resent if result is not None else 0
    app.info(stats.summary(0))
    if resent:
        app.warn(_resent_line(resent))
    if as_json:
        _json_summary(topic, stats, 0, records, None, 0, resent)
    return 0


def _delimiter(null: bool, delimiter: bytes) -> bytes:
    """-0/--null is -d '\\0'; both given is a usage error."""
    if not null:
        return delimiter
    from click.core import ParameterSource

    if click.get_current_context().get_parameter_source("delimiter") != ParameterSource.DEFAULT:
        raise click.UsageError("-0/--null and -d/--delimiter cannot be used together (-0 is -d '\\0')")
    return b"\0"


def _producers(app, conn: dict, topic: str, deadline: float | None) -> list[str]:
    """The nsqd addresses to publish to (given, or found through nsqlookupd); a lookup that
    fails as --timeout passes is exit 3, not 1."""
    from ...errors import NSQError
    from ..app import DeadlineExceeded

    try:
        return resolve_producers(app, conn, topic, deadline)
    except NSQError as e:
        if deadline is not None and time.monotonic() >= deadline - 0.01:
            raise DeadlineExceeded(f"--timeout passed: {e}") from e
        raise


def _fail(app, e: BaseException, topic: str, stats: Tally, records: BodyReader, stopper, as_json: bool,
          deadline: float | None):
    """The run stopped before every record was published (``e``: PublishError, Interrupted or
    Stopped): say what was published, what nsqd may hold and the --skip that resumes, then
    raise the outcome (DeadlineExceeded, Interrupted or PublishError)."""
    from ...client.future import Stopped
    from ...errors import PublishError
    from ..app import DeadlineExceeded, Interrupted

    cause = e.cause if isinstance(e, PublishError) and e.cause is not None else e
    unanswered = getattr(e, "unanswered", 0)
    resent = getattr(e, "resent", 0)
    failed = records.outstanding + (1 if getattr(cause, "record", None) else 0)
    interrupted = isinstance(cause, (Interrupted, Stopped))
    expired = interrupted and stopper.expired and stopper.signum is None
    # stopped on purpose: what was never written is not sent, not failed
    unsent = max(0, records.outstanding - unanswered) if interrupted else 0
    if stats.published or stats.skipped_empty or stats.skipped_invalid:  # else the error says it all
        app.info(stats.summary(failed, stopped=True, unsent=unsent))
    if resent:
        app.warn(_resent_line(resent))
    where = records.where(unanswered)
    if as_json:
        error = str(cause)
        if expired:
            error = "--timeout passed"
        elif interrupted:  # their str() is empty: say what happened
            import signal

            signum = stopper.signum or getattr(cause, "signum", None) or signal.SIGINT
            error = f"interrupted ({signal.Signals(signum).name})"
        _json_summary(topic, stats, failed, records, error, unanswered, resent, unsent)
    if expired:
        raise DeadlineExceeded(f"--timeout passed: {where}") from None
    if interrupted:
        raise Interrupted(stopper.signum or getattr(cause, "signum", 2), where) from None
    bad = getattr(cause, "record", None)
    what = str(cause)
    if getattr(cause, "code", "") in ("E_BAD_MESSAGE", "E_BAD_BODY"):
        if records.outstanding and getattr(cause, "index", None) is not None:
            # it answered a publish: the ledger split down to this one record (or the DPUB of
            # it), and nsqd refused it alone
            bad = records.numbers.record(records.acked)
            what = f"record {bad} refused by nsqd: {cause}"
        else:  # not a publish's answer (IDENTIFY over nsqd's --max-body-size): no record to blame
            what = f"nsqd refused: {cause}"
    if bad is not None and bad == records.resume_at + 1:
        where += f" (--skip {bad} also leaves out record {bad})"
    if deadline is not None and time.monotonic() >= deadline - 0.01:
        raise DeadlineExceeded(f"--timeout passed: {what}; {where}") from None
    raise PublishError(f"{what}; {where}", stats.published, failed, cause) from None


def _resent_line(resent: int) -> str:
    return (f"{resent} records were sent again after a connection was lost before nsqd answered them: "
            "the nsqd they were first sent to may hold them too (possible duplicates)")


def _forced_lines(stats: Tally, records: BodyReader, producer) -> list[str]:
    """What a forced exit (a second signal) says: the summary and the resume line, from what
    is known at that instant (a signal handler: read only)."""
    publishing = producer.publishing
    unanswered = publishing.unanswered() if publishing is not None else 0
    unsent = max(0, records.outstanding - unanswered)  # never written: not failed (as _fail says it)
    return [stats.summary(records.outstanding, stopped=True, unsent=unsent), records.where(unanswered)]


def _json_summary(topic, stats: Tally, failed: int, records: BodyReader, error: str | None, unanswered: int,
                  resent: int, unsent: int = 0) -> None:
    import json

    from ..app import write_stdout

    span = records.unanswered_range(unanswered)
    doc = {"topic": topic, "published": stats.published, "skipped_empty": stats.skipped_empty,
           "skipped_invalid": stats.skipped_invalid, "failed": failed - unsent, "not_sent": unsent,
           "bytes": stats.bytes,
           "seconds": round(time.monotonic() - stats.start, 3), "resume_skip": records.resume_at,
           "unanswered": min(unanswered, records.outstanding), "unanswered_records": list(span) if span else None,
           "resent": resent, "error": error}
    write_stdout(json.dumps(doc) + "\n")


class _Progress:
    """A rich progress bar on stderr (TTY only): records, bytes, rate, ETA for files."""

    def __init__(self, app, stats: Tally, sources):
        import os

        from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        total = None
        try:
            total = sum(os.fstat(s.fileno()).st_size for s in sources) or None
        except (OSError, ValueError):
            pass
        self.stats = stats
        self.progress = Progress(TextColumn("{task.fields[records]} records"), BarColumn(), TaskProgressColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=app.console)
        self.task = self.progress.add_task("mpub", total=total, records=0)
        self.progress.start()

    def update(self) -> None:
        self.progress.update(self.task, completed=self.stats.bytes, records=self.stats.published)

    def finish(self) -> None:
        """Everything was published: the bar ends full (delimiters are not counted in bytes)."""
        total = self.progress.tasks[0].total
        self.progress.update(self.task, completed=total if total is not None else self.stats.bytes,
                             records=self.stats.published)
        self.progress.refresh()

    def stop(self) -> None:
        from ..views import stop_display

        stop_display(self.progress.stop)
