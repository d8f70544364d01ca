"""``nsqcli to-file``'s run, without click: from a spec (plain JSON values) to the archiving loop,
its log lines and its summary.

The click command (nsqcli.cli.commands.to_file) parses and checks the options and builds the
spec; then it hands the spec to a fresh process of its own (nsqcli.cli.handoff) or, under click's
CliRunner, calls :func:`run` itself. Either way the archive is run from the spec alone, so what
the spec carries is all the run gets - a test that passes in-process tests the hand-off's
content too."""

from __future__ import annotations

import logging
import signal
import sys
import time

from ..client.config import Config, TLSConfig
from .app import once_each

#: bump when a field of the spec changes meaning: a handed-off process refuses another version
SPEC_VERSION = 1


def config_spec(cfg: Config) -> dict:
    """The Config's fields as JSON values (``on_notice``, a function, becomes ``notice: bool``)."""
    out = {name: getattr(cfg, name) for name, _ in cfg._fields if name not in ("tls", "on_notice")}
    out["tls"] = {name: getattr(cfg.tls, name) for name, _ in cfg.tls._fields}
    out["notice"] = cfg.on_notice is not None
    return out


def config_from_spec(spec: dict, app) -> Config:
    fields = dict(spec)
    tls = TLSConfig(**fields.pop("tls"))
    if fields.pop("notice"):
        fields["on_notice"] = once_each(app.warn)
    return Config(tls=tls, **fields)


def run(app, spec: dict) -> int:
    """Archive until SIGINT/SIGTERM (clean stop, exit 0) or a write error (NSQError, exit 1)."""
    from ..archive.archiver import Archiver
    from ..archive.writer import FileOptions
    from ..records import Formatter
    from .app import Outages, source_error, sources_recovered
    from .signals import GracefulStop

    if spec.get("version") != SPEC_VERSION:
        raise ValueError(f"to-file spec version {spec.get('version')!r}, this nsqcli runs {SPEC_VERSION}")
    cfg = config_from_spec(spec["config"], app)
    opts = FileOptions(**spec["file_options"])
    setup_logging(spec["log_level"])
    formatter = Formatter(spec["format"])
    sep = b"\n"

    def records(msgs: list) -> bytes:  # each record with its separator, in one join (no `+ sep` copy)
        out = formatter.many(msgs)
        out.append(b"")
        return sep.join(out)

    logger = logging.getLogger("nsqcli")  # said when it starts, counted, then "recovered"
    outages = Outages(_LogSays(logger))
    show_live = spec["live"]
    topic_pattern, lookupd = spec["topic_pattern"], spec["lookupd"]
    archiver = Archiver(topics=list(spec["topics"]), topic_pattern=topic_pattern,
                        topic_refresh=spec["topic_refresh"], channel=spec["channel"], opts=opts,
                        formatter=records, config=cfg,
                        nsqd=spec["nsqd"], lookupd=lookupd, sync_interval=spec["sync_interval"],
                        on_error=lambda e: source_error(outages, e),
                        status_interval=0.0 if show_live else spec["status_interval"])
    stopper = GracefulStop(archiver.stop_event).install()
    signal.signal(signal.SIGHUP, lambda *_: archiver.hup_event.set())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # blocked across a hand-off's exec
    with stopper.blocking():  # a signal while connecting ends it at once (130)
        archiver.start()
    if topic_pattern and not archiver.topics:  # said once; "archiving topic X" when one comes
        logger.info("waiting for a topic matching %r: nsqlookupd %s knows none with a producer yet "
                    "(asked every %gs)", topic_pattern, ", ".join(lookupd), spec["topic_refresh"])
    view = None
    if show_live:
        from .views import LiveArchive

        view = LiveArchive(app.console, archiver).start()
    try:
        while not archiver.stop_event.wait(0.2):
            sources_recovered(outages, [a.consumer for a in list(archiver.topics.values())])
    finally:
        if view is not None:
            view.stop()
        archiver.stop()
    if archiver.fatal is not None:
        from ..errors import NSQError

        e = archiver.fatal
        raise NSQError(f"stopped: cannot write the archive ({getattr(e, 'strerror', None) or e}"
                       f"{': ' + str(e.filename) if getattr(e, 'filename', None) else ''}); "
                       "messages not on disk were requeued")
    if spec["json"]:
        json_summary(archiver.status())
    sys.stderr.flush()
    return 0


class _LogSays:
    """What Outages needs of an App (warn, info), said through the to-file log lines."""

    def __init__(self, logger: logging.Logger):
        self.warn, self.info = logger.warning, logger.info


def json_summary(rows: list[dict]) -> None:
    """The end-of-run summary, one JSON line: per topic and in total."""
    import json

    from .app import write_stdout

    keys = ("received", "finished", "closed", "syncs", "timed_out", "lost_responses", "late_messages")
    topics = [{"topic": r["topic"], **{k: r[k] for k in keys}} for r in rows]
    doc = {"received": sum(r["received"] for r in rows), "finished": sum(r["finished"] for r in rows),
           "files_closed": sum(r["closed"] for r in rows), "topics": topics}
    write_stdout(json.dumps(doc) + "\n")


class _StderrLines(logging.Handler):
    """Log records as whole lines through the app's one stderr lock (never glued to a warning
    another thread is writing)."""

    def emit(self, record: logging.LogRecord) -> None:
        from .app import write_stderr

        try:
            write_stderr(self.format(record))
        except Exception:
            self.handleError(record)


def setup_logging(level: str) -> None:
    handler = _StderrLines()
    handler.setFormatter(logging.Formatter("%(asctime)s nsqcli to-file %(levelname)s: %(message)s",
                                           "%Y-%m-%dT%H:%M:%S"))
    handler.formatter.converter = time.gmtime
    root = logging.getLogger("nsqcli")
    root.handlers[:] = [handler]
    root.setLevel({"warn": logging.WARNING}.get(level, getattr(logging, level.upper())))
