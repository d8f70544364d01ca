"""``nsqcli to-file``: archive topics to files; a message is FINed only once it is fsync'ed."""

from __future__ import annotations

import re

import click

from ..command import command, option
from ..options import (build_config, connection_options, daemon_options, nsqd_addresses, pop_connection, pop_run,
                       topic_arguments)
from ..types import DURATION, Size

@command("to-file", examples="""
nsqcli to-file -t events --output-dir /archive --work-dir /archive/.work --gzip --rotate-size 100M
nsqcli to-file --topic-pattern '^app\\.' --lookupd-http-address 127.0.0.1:4161 -f json
nsqcli to-file -t events --output-dir . --rotate-interval 1h --sync-interval 5s
kill -HUP $(pgrep -f 'nsqcli to-file')      # close and move the current files now
""")
@topic_arguments(many=True, required=False, channel="option", channel_default="nsqcli_to_file",
                 topic_help="Topic to archive (repeatable; or as arguments).")
@option("--topic-pattern", help="Regex: archive every topic nsqlookupd knows that matches (needs lookupd).")
@option("--topic-refresh", type=DURATION, default="1m", show_default=True,
              help="How often --topic-pattern re-reads the topic list (also at start-up).")
@option("--max-in-flight", type=click.IntRange(1, 1_000_000), default=200, show_default=True,
              help="Messages in flight per topic; also the largest un-synced batch.")
@option("--output-dir", type=click.Path(file_okay=False), default="/tmp", show_default=True,
              help="Where finished files go.")
@option("--work-dir", type=click.Path(file_okay=False),
              help="Where files are written until closed (same filesystem as --output-dir).")
@option("--filename-format", default="<TOPIC>.<HOST><REV>.<DATETIME>.log", show_default=True,
              help="Tokens: <TOPIC> <HOST> <REV> <DATETIME> <PID>; may contain '/'.")
@option("--datetime-format", default="%Y-%m-%d_%H", show_default=True, help="strftime for <DATETIME>.")
@option("--local-time", is_flag=True, help="<DATETIME> in local time instead of UTC.")
@option("--host-identifier", help="Replaces <HOST> (may contain <SHORT_HOST>, <HOSTNAME>).")
@option("--gzip", "use_gzip", is_flag=True, help="Compress (multi-member gzip: one member per sync).")
@option("--gzip-level", type=click.IntRange(1, 9), default=6, show_default=True)
@option("--rotate-size", type=Size(), default="0", help="Rotate after this many bytes on disk (0 = off).")
@option("--rotate-interval", type=DURATION, default="0", help="Rotate files older than this (0 = off).")
@option("--sync-interval", type=DURATION, default="30s", show_default=True,
              help="Longest time a message waits un-synced (and un-FINed).")
@option("--skip-empty-files", is_flag=True, help="Accepted for nsq_to_file compatibility "
              "(nsqcli never creates empty files: files open on the first message).")
@option("-f", "--format", "fmt", type=click.Choice(["raw", "json"]), default="raw", show_default=True,
              help="raw: body + newline (like nsq_to_file); json: the NDJSON envelope of tail --format json.")
@option("--grep", "grep", metavar="REGEX", help="Archive only messages whose body matches REGEX (RE2 syntax, as Go's "
        "regexp, on the body's bytes); the others are FINed without being written, and counted.")
@option("--where", "where", metavar="EXPR", help="Archive only messages for which EXPR is true (the others are "
        "FINed and counted); the syntax of 'nsqcli tail --where', e.g. '.level == \"error\" and size < 65536'.")
@daemon_options(timeout=False, log_format="text", live_help="Live status table of the topics and connections "
                "(default: when stderr is a terminal that can draw one; elsewhere status lines).")
@connection_options(lookupd_poll=True)
@click.pass_obj
def to_file(app, topics, topic_pattern, topic_refresh, channel, max_in_flight, output_dir, work_dir,
            filename_format, datetime_format, local_time, host_identifier, use_gzip, gzip_level,
            rotate_size, rotate_interval, sync_interval, skip_empty_files, fmt, grep, where, **kwargs):
    """Archive TOPIC(s) to files; run as a daemon.

    A message is FINed only after the file holding it is fsync'ed (gzip: after the member holding
    it is complete), so a crash loses nothing: un-FINed messages come back from nsqd. Files are
    written in --work-dir and moved into --output-dir when closed. SIGHUP closes and moves the
    current files; SIGINT/SIGTERM drain, sync, FIN, close and exit 0. A write or fsync error
    (disk full) requeues what is not durable and exits 1.

    Without the live table, once its options are checked to-file continues in a fresh image of
    itself that never loads the CLI framework (~4 MB less for a daemon): same pid, same command
    line, same open files. NSQCLI_NO_HANDOFF=1 keeps it in the first image.
    """
    settings = pop_run(kwargs)
    conn = pop_connection(kwargs)
    lookupd = list(conn.get("lookupd_http_addresses") or ())
    _refuse_usage(settings, topics, topic_pattern, lookupd, sync_interval, grep, where, use_gzip)
    file_options = dict(output_dir=output_dir, work_dir=work_dir, filename_format=filename_format,
                        datetime_format=datetime_format, host_identifier=host_identifier,
                        local_time=local_time, gzip=use_gzip, gzip_level=gzip_level,
                        rotate_size=rotate_size, rotate_interval=rotate_interval,
                        skip_empty_files=skip_empty_files)
    _check_files(file_options, topics)
    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0)
    if cfg.msg_timeout is not None and sync_interval >= cfg.msg_timeout:
        app.warn("--sync-interval should stay below --msg-timeout, or messages time out before they are FINed")
    from .. import archiving, handoff

    from ..harness import can_draw

    show_live = settings.live is not False and can_draw(app)
    spec = dict(version=archiving.SPEC_VERSION, topics=list(topics), topic_pattern=topic_pattern,
                topic_refresh=topic_refresh, channel=channel, file_options=file_options,
                config=archiving.config_spec(cfg), lookupd=lookupd,
                nsqd=nsqd_addresses(conn) if not lookupd or conn.get("nsqd_tcp_addresses") else [],
                sync_interval=sync_interval, status_interval=settings.status_interval,
                live=settings.live, log_level=settings.log_level,
                log_format=settings.log_format, metrics_address=settings.metrics_address,
                status_file=settings.status_file, format=fmt, json=settings.as_json, verbosity=app.verbosity,
                filter={"grep": grep, "where": where})
    if not show_live:  # a daemon: the rest runs in a fresh image without click (nsqcli.cli.handoff)
        handoff.hand_off("to-file", spec)
    return archiving.run(app, spec)


def _refuse_usage(settings, topics, topic_pattern, lookupd: list, sync_interval: float, grep, where,
                  use_gzip: bool) -> None:
    """(usage) --log-format, TOPIC or --topic-pattern, --sync-interval, --grep/--where, --gzip-level."""
    if settings.log_format == "plain":
        raise click.BadParameter("to-file logs as 'text' or 'json' (a daemon's lines carry their time)",
                                 param_hint="'--log-format'")
    if not topics and not topic_pattern:
        raise click.UsageError("give --topic or --topic-pattern")
    if sync_interval <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--sync-interval'")
    if topics and topic_pattern:
        raise click.UsageError("--topic and --topic-pattern cannot be used together (a pattern already "
                               "chooses the topics)")
    from ...filters import FilterError, make_filter

    try:
        make_filter(grep, where)  # checked here; compiled again from its text in the archiving image
    except FilterError as e:
        raise click.BadParameter(str(e), param_hint=f"'{e.option}'") from None
    ctx = click.get_current_context()
    from click.core import ParameterSource

    if not use_gzip and ctx.get_parameter_source("gzip_level") != ParameterSource.DEFAULT:
        raise click.UsageError("--gzip-level needs --gzip")
    if topic_pattern:
        if not lookupd:
            raise click.UsageError("--topic-pattern needs --lookupd-http-address")
        try:
            re.compile(topic_pattern)
        except re.error as e:
            raise click.UsageError(f"invalid --topic-pattern {topic_pattern!r}: {e}") from None


def _check_files(file_options: dict, topics) -> None:
    """(usage) the file options, the names they make, the directories (writable, one filesystem)."""
    from ...archive.writer import FileOptions

    opts = FileOptions(**file_options)
    try:
        opts.validate()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    _check_names_stay_inside(opts, topics or ["x"])
    _check_writable(file_options["output_dir"], file_options["work_dir"])
    _check_same_filesystem(file_options["output_dir"], file_options["work_dir"])


def _existing(path: str) -> str:
    import os

    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _check_names_stay_inside(opts, topics) -> None:
    """The names real topics, the host and the date make (not only the format's shape) stay in
    --output-dir: '..' is a valid topic name, '/../' a valid --datetime-format."""
    from ...archive.writer import escaping_name

    for topic in topics:
        name = escaping_name(topic, opts)
        if name is not None:
            raise click.UsageError(f"topic {topic!r} would be written to {name!r}, outside --output-dir "
                                   "(check --filename-format, --datetime-format and --host-identifier)")


def _check_writable(output_dir: str, work_dir: str | None) -> None:
    """Refused before subscribing, not at the first message: a directory that cannot be created
    or written is a bad --output-dir / --work-dir, like one that is a file."""
    from ...archive.files import check_writable_dir

    for flag, path in (("--output-dir", output_dir), ("--work-dir", work_dir)):
        if not path:
            continue
        try:
            check_writable_dir(path)
        except OSError as e:
            name = str(e.filename or "")
            where = f": {name}" if name and name != path and ".nsqcli-probe-" not in name else ""
            raise click.BadParameter(f"cannot write files in {path!r} ({e.strerror or e}{where})",
                                     param_hint=f"'{flag}'") from None


def _check_same_filesystem(output_dir: str, work_dir: str | None) -> None:
    """Closed files are renamed from --work-dir into --output-dir; a rename cannot cross file
    systems, so that would fail at the first rotation - refuse at start-up instead."""
    import os

    if not work_dir:
        return
    a, b = _existing(output_dir), _existing(work_dir)
    if os.stat(a).st_dev != os.stat(b).st_dev:
        raise click.UsageError(f"--work-dir {work_dir} and --output-dir {output_dir} are on different file "
                               "systems: closed files are moved by rename, which cannot cross them; "
                               "put --work-dir on the same file system (e.g. OUTPUT_DIR/.work)")
