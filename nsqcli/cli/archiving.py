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
from .harness import Job

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


def settings_of(spec: dict):
    from .harness import Settings

    return Settings(live=spec["live"], status_interval=spec["status_interval"], as_json=spec["json"],
                    metrics_address=spec.get("metrics_address"), status_file=spec.get("status_file"),
                    log_format=spec.get("log_format") or "text", log_level=spec["log_level"])


def run(app, spec: dict) -> int:
    """Archive until SIGINT/SIGTERM (clean stop, exit 0) or a write error (NSQError, exit 1)."""
    from .harness import run as run_harness

    if spec.get("version") != SPEC_VERSION:
        raise ValueError(f"to-file spec version {spec.get('version')!r}, this nsqcli runs {SPEC_VERSION}")
    settings = settings_of(spec)
    return run_harness(app, ToFile(app, spec), settings)


class ToFile(Job):
    name = "to-file"
    handles_hup = True

    def __init__(self, app, spec: dict):
        super().__init__()
        from ..archive.archiver import Archiver
        from ..archive.writer import FileOptions
        from ..filters import make_filter
        from ..records import Formatter
        from .app import Outages, source_error

        cfg = config_from_spec(spec["config"], app)
        formatter = Formatter(spec["format"])
        sep = b"\n"
        self.accept = accept = make_filter(**(spec.get("filter") or {}))  # --grep/--where, from their text
        unmatched = self._unmatched = {}  # topic -> count (each topic's batches come one at a time)

        def records(msgs: list) -> bytes:  # each record with its separator, in one join (no `+ sep` copy)
            if accept is not None and msgs:  # the others are FINed with the batch, never written
                n, topic = len(msgs), msgs[0].topic
                msgs = [m for m in msgs if accept(m)]
                if len(msgs) < n:
                    unmatched[topic] = unmatched.get(topic, 0) + n - len(msgs)
                if not msgs:
                    return b""
            out = formatter.many(msgs)
            out.append(b"")
            return sep.join(out)

        self.log = logging.getLogger("nsqcli")
        self.outages = Outages(app)  # said when it starts, reminded while it lasts, then "recovered"
        self.spec = spec
        self.archiver = Archiver(topics=list(spec["topics"]), topic_pattern=spec["topic_pattern"],
                                 topic_refresh=spec["topic_refresh"], channel=spec["channel"],
                                 opts=FileOptions(**spec["file_options"]), formatter=records, config=cfg,
                                 nsqd=spec["nsqd"], lookupd=spec["lookupd"], sync_interval=spec["sync_interval"],
                                 on_error=lambda e: source_error(self.outages, e), status_interval=0.0)
        self.archiver.stop_event = self.done  # one event: a write error stops the run as a signal does
        self._status_last: dict[str, int] = {}

    def consumers(self) -> list:
        return [a.consumer for a in list(self.archiver.topics.values())]

    def install_signals(self) -> None:
        from .setter import SETTER

        SETTER.start()
        signal.signal(signal.SIGHUP, lambda *_: SETTER.post(self.archiver.hup_event))  # no lock in a handler
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # blocked across a hand-off's exec

    def start(self, deadline, stopper) -> None:
        self.archiver.start()
        spec = self.spec
        if spec["topic_pattern"] and not self.archiver.topics and not self.done.is_set():
            # said once; "archiving topic X" when one comes
            self.log.info("waiting for a topic matching %r: nsqlookupd %s knows none with a producer yet "
                          "(asked every %gs)", spec["topic_pattern"], ", ".join(spec["lookupd"]), spec["topic_refresh"])

    def interrupt(self) -> None:
        self.archiver.interrupt()

    def last_progress(self) -> float:
        return time.monotonic()  # to-file has no --idle-timeout

    def live_view(self, console):
        from .views import LiveArchive

        return LiveArchive(console, self.archiver)

    def stop(self, end) -> None:
        self.archiver.stop()

    def status_lines(self, elapsed: float) -> list[str]:
        """A line per topic (daemons without a terminal)."""
        lines = []
        interval = max(1e-9, self.spec["status_interval"] or elapsed)
        for row in self.archiver.status():
            before = self._status_last.get(row["topic"], 0)
            self._status_last[row["topic"]] = row["received"]
            synced = (time.strftime("%H:%M:%SZ", time.gmtime(row["last_sync"])) if row["last_sync"] else "never")
            lines.append(f"topic {row['topic']}: {row['received']} messages ({(row['received'] - before) / interval:.1f}/s), "
                         f"{row['pending']} pending, file {row['file'] or '-'} ({row['size']} bytes), {row['syncs']} syncs "
                         f"(last {synced}), {row['closed']} files closed, {row['timed_out']} timed out, "
                         f"{row['lost_responses']} lost acks, {row['late_messages']} late")
        return lines

    def topic_rows(self) -> list[dict]:
        channel = self.spec["channel"]
        rows = []
        for row in self.archiver.status():
            rows.append({"topic": row["topic"], "channel": channel, "received": row["received"],
                         "finished": row["finished"], "requeued": row.get("requeued", 0),
                         "timed_out": row["timed_out"], "lost_responses": row["lost_responses"]})
        return rows

    def counters(self) -> dict:
        t = self.archiver.totals()
        out = {"bytes_written": t["bytes_written"], "fsyncs": t["fsyncs"], "files_rotated": t["files_rotated"]}
        if self.accept is not None:
            out["unmatched"] = self.unmatched
        return out

    @property
    def unmatched(self) -> int:
        return sum(list(self._unmatched.values()))

    def errors(self) -> dict:
        return {"write": self.archiver.totals()["write_errors"]}

    def gauges(self) -> dict:
        return {"last_fsync_timestamp_seconds": self.archiver.totals()["last_fsync"]}

    def problems(self) -> list[str]:
        return [self.archiver.fatal_message()] if self.archiver.fatal is not None else []

    def finish(self, elapsed, expired, settings, app) -> None:
        archiver = self.archiver
        if archiver.fatal is not None:
            from ..errors import NSQError

            raise NSQError(archiver.fatal_message())
        if self.unmatched:
            self.log.info("%d message(s) did not match --grep/--where and were FINed without being written",
                          self.unmatched)
        if settings.as_json:
            json_summary(archiver.status())
        sys.stderr.flush()


def json_summary(rows: list[dict]) -> None:
    """The end-of-run summary, one JSON line: per topic and in total."""
    import json

    from .app import write_stdout

    keys = ("received", "finished", "closed", "syncs", "timed_out", "lost_responses", "late_messages")
    topics = [{"topic": r["topic"], **{k: r[k] for k in keys}} for r in rows]
    doc = {"received": sum(r["received"] for r in rows), "finished": sum(r["finished"] for r in rows),
           "files_closed": sum(r["closed"] for r in rows), "topics": topics}
    write_stdout(json.dumps(doc) + "\n")
