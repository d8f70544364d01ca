"""``nsqcli replay``: re-publish archived messages into NSQ through Spark."""

from __future__ import annotations

import json
import sys
import threading
import time

import click

from ..command import command, option
from ..options import connection_options, pop_connection, topic_arguments
from ..spark_options import check_archives, spark_session, sink_options, spark_error, spark_options
from ..types import DURATION, MOMENT, TOPIC


@command(examples="""
nsqcli replay /archive/events/ -t events --since 2026-11-22T08:00Z --until 2026-11-22T09:00Z
nsqcli replay '/archive/*.log.gz' -t events_fixed --where "body_text like '%\\"type\\":\\"order\\"%'"
nsqcli replay /archive/ -t events --dry-run
nsqcli replay /archive/ -t events --master spark://10.0.0.5:7077 --rate 5000
""")
@topic_arguments(topic_help="Publish into this topic (or the first argument).", rest="archives",
                 rest_metavar="ARCHIVE...", rest_min=1)
@option("--since", type=MOMENT, help="Only messages at or after this time (ISO 8601 or e.g. 2h = two hours ago).")
@option("--until", type=MOMENT, help="Only messages before this time.")
@option("--where", "where", metavar="SQL",
              help="A Spark SQL condition over body_text, topic, host, timestamp, attempts, id, nsqd, hour.")
@option("--from-topic", "from_topics", multiple=True, type=TOPIC,
              help="Only messages archived from this topic (repeatable; for mixed archives).")
@option("--rate", type=click.FloatRange(min=0.001),
        help="Messages per second for the whole job (split over the tasks the session runs at once).")
@option("--retry-timeout", type=DURATION, default="60s", show_default=True, metavar="DURATION",
        help="How long a task keeps trying its nsqd addresses, with backoff, after nsqd's last OK (an nsqd "
             "restart) before it stops.")
@option("--dry-run", is_flag=True, help="Count what would be published, by topic and hour; publish nothing.")
@option("--json", "as_json", is_flag=True, help="The result (or the --dry-run counts) as one JSON line on stdout.")
@option("-f", "--format", "fmt", type=click.Choice(["auto", "raw", "json"]), default="auto", show_default=True,
              help="Archive format (auto: from the first record).")
@spark_options
@connection_options()
@click.pass_obj
def replay(app, topic, rest, since, until, where, from_topics, rate, retry_timeout, dry_run, as_json, fmt, master,
           remote, confs, py_files, spark_log_level, **kwargs):
    """Re-publish archived messages (what to-file or nsq_to_file wrote: raw or JSON, gzip or
    not; files, directories, globs) into TOPIC, on Spark.

    \b
    --since/--until use the JSON envelope's timestamp, else the hour in the file name.
    Delivery is at least once: a task that cannot publish (nsqd still failing after
    --retry-timeout) stops, and the command fails saying how many messages nsqd acknowledged;
    running it again publishes those again. The last line says how many messages nsqd
    acknowledged (and when a task ran again after a lost attempt, that more may have landed).
    """
    archives = tuple(rest)
    conn = pop_connection(kwargs)
    if since and until and since >= until:
        raise click.UsageError("--since must be before --until")
    check_archives(archives, remote)
    with spark_session(app, "replay", master, remote, confs, py_files, spark_log_level) as spark:
        return _replay(app, spark, archives, topic, since, until, where, from_topics, rate, dry_run, fmt, conn,
                       as_json, retry_timeout)


def _replay(app, spark, archives, topic, since, until, where, from_topics, rate, dry_run, fmt, conn,
            as_json=False, retry_timeout=60.0):
    from ...spark.jobs import archive_selection, counts_by_topic_and_hour

    try:
        df = archive_selection(spark, archives, since, until, where, from_topics, fmt)
        if dry_run:
            rows = counts_by_topic_and_hour(df)
    except Exception as e:
        if dry_run or type(e).__name__ in ("AnalysisException", "ParseException"):
            raise spark_error(e) from None
        raise
    if dry_run:
        _print_counts(app, rows, topic, as_json)
        return 0
    options = {**sink_options(conn), "topic": topic, "retryTimeout": f"{round(retry_timeout * 1000)}ms"}
    ledgers, el = _publish(app, spark, df, options, rate)
    _report(app, ledgers, topic, el, as_json)
    return 0


def _print_counts(app, rows: list, topic: str, as_json: bool) -> None:
    """--dry-run: what would be published, by topic and hour."""
    from ..app import write_stdout

    total = sum(n for _, _, n in rows)
    if as_json:
        hours = [{"topic": t, "hour": h.strftime("%Y-%m-%dT%H:00:00Z") if h else None, "messages": n}
                 for t, h, n in rows]
        write_stdout(json.dumps({"dry_run": True, "topic": topic, "messages": total, "by_hour": hours}) + "\n")
        return
    lines = [f"{'TOPIC':<24} {'HOUR (UTC)':<17} {'MESSAGES':>10}"]
    lines += [f"{t or '-':<24} {h.strftime('%Y-%m-%d %H:00') if h else '-':<17} {n:>10}" for t, h, n in rows]
    write_stdout("\n".join(lines) + "\n")
    app.info(f"dry run: {total} message{'s' * (total != 1)} would be published to {topic}; nothing was")


def _publish(app, spark, df, options: dict, rate) -> tuple[list, float]:
    """The Spark job that publishes the bodies: every task's ledger (what nsqd acknowledged), seconds."""
    from ...spark.jobs import publish
    from ...spark.session import is_connect

    # Spark's task progress on a TTY (the status tracker needs a driver in this process)
    progress = (_Progress(spark, app) if sys.stderr.isatty() and app.verbosity >= 0 and not is_connect(spark)
                else None)
    t0 = time.monotonic()
    try:
        if progress:
            progress.start()
        ledgers = publish(df.select("body"), options, rate)
    except Exception as e:
        from ...errors import NSQError

        err = spark_error(e)
        if isinstance(err, click.UsageError):  # through Connect, --where is analysed only now
            raise err from None
        text = err.format_message() if isinstance(err, click.ClickException) else str(err)
        raise NSQError(f"{text}; the Spark job failed before its tasks reported what nsqd acknowledged "
                       "(at-least-once: run again, and the messages that were published are published "
                       "again)") from None
    finally:
        if progress:
            progress.stop()
    return ledgers, time.monotonic() - t0


def _report(app, ledgers: list, topic: str, el: float, as_json: bool) -> None:
    """What nsqd acknowledged; exit 1 when a task stopped early or was skipped."""
    from ...spark.sink import SKIPPED
    from ..app import write_stdout

    done = sum(m["messages"] for m in ledgers)
    # a task Spark ran again (an executor lost): its lost attempt's messages were published too,
    # and no ledger counts them; a lost connection's batches sent again may be in nsqd twice
    rerun = sum(1 for m in ledgers if m.get("attempt"))
    resent = sum(m.get("resent") or 0 for m in ledgers)
    more = ""
    if rerun:
        more += (f"; {rerun} task{'s' * (rerun != 1)} ran again after a lost attempt, which published an unknown "
                 "number more (at least once)")
    if resent:
        more += f"; up to {resent} may be in nsqd twice (sent again after a lost connection)"
    failed = [m for m in ledgers if m["error"] and not m["error"].startswith(SKIPPED)]
    skipped = sum(1 for m in ledgers if m["error"] and m["error"].startswith(SKIPPED))
    if failed or skipped:
        from ...errors import NSQError

        first = (failed or [m for m in ledgers if m["error"]])[0]["error"]
        tasks = f"{len(failed)} of {len(ledgers)} tasks stopped early" + (f", {skipped} skipped" if skipped else "")
        raise NSQError(f"{first}; nsqd acknowledged {done} messages ({tasks}; at-least-once: run again, "
                       f"and what was acknowledged is published again){more}")
    app.info(f"replayed {done} message{'s' * (done != 1)} into {topic} in {el:.1f}s "
             f"({done / el if el else 0:,.0f} msg/s){more}")
    if as_json:
        write_stdout(json.dumps({"dry_run": False, "topic": topic, "published": done, "rerun_tasks": rerun,
                                 "may_be_duplicates": resent, "elapsed": round(el, 3)}) + "\n")


class _Progress(threading.Thread):
    """Spark's task progress on one stderr line (TTY only)."""

    def __init__(self, spark, app):
        super().__init__(daemon=True)
        self.tracker = spark.sparkContext.statusTracker()
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.5):
            done = total = 0
            for sid in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(sid)
                if info:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
                sys.stderr.write(f"\rnsqcli: replay: {done}/{total} tasks done ")
                sys.stderr.flush()

    def stop(self) -> None:
        self._stop.set()
        self.join(1)
        from ..views import stop_display

        stop_display(lambda: (sys.stderr.write("\r\033[K"), sys.stderr.flush()))
