"""The archiving daemon behind ``nsqcli to-file``: consumers whose batches are written to
archive files (nsqcli.archive.writer) and FINed only after they are fsync'ed.

Sync (write + fsync, then FIN every buffered message) happens when the buffer reaches
max_in_flight, when the consumer is starved (some connection has >= 85 % of its RDY in
flight: nsqd will not send more until we FIN), every ``sync_interval``, on SIGHUP, and at
stop. A write or fsync error stops the run: the buffered messages are requeued (never FINed),
and :meth:`Archiver.fatal_message` says what failed (the path) and the messages' fate.

Log lines (INFO unless said): every file closed with why (``closed PATH (--rotate-size reached;
1048576 bytes, 5000 records)``), ``SIGHUP: closing and moving N files``, ``archiving topic T``,
``topic T disappeared ...`` (WARNING when it was still receiving messages). Each carries an
event name and fields (``extra``) for ``--log-format json``.

Topics come from ``--topic`` or from ``--topic-pattern`` matched against the topics that every
reachable nsqlookupd knows, refreshed every ``topic_refresh`` (first at start-up). Topics that
disappear from all lookupds are unsubscribed and their files closed.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..client.config import Config
from ..client import fdlimit
from ..client.consumer import Consumer
from ..client.workers import HandlerPool
from ..errors import LookupdError, NSQError
from ..client.http import ask_http, http_json, lookup_topic
from .recovery import recover
from .writer import ArchiveFile, FileOptions, escaping_name

log = logging.getLogger("nsqcli.archive.archiver")

#: the per-topic counts kept when a topic is removed (added back if it is archived again)
RETIRED_KEYS = ("received", "finished", "requeued", "syncs", "closed", "bytes_written", "timed_out",
                "lost_responses", "late_messages")
REASONS = {"size": "--rotate-size reached", "interval": "--rotate-interval passed",
           "datetime": "the <DATETIME> of its name changed", "sighup": "SIGHUP", "stop": "stopping",
           "topic_gone": "its topic disappeared"}
#: errnos of a full disk (or a file size limit): a restart fails again until there is room
FULL = {28, 122, 27}  # ENOSPC, EDQUOT, EFBIG


def ev(event: str, **fields) -> dict:
    """``extra=`` for a record with an event and fields (nsqcli.daemon.logs shows them)."""
    return {"event": event, "fields": fields}


def say_closed(topic: str, path: Path, reason: str, size: int, records: int) -> None:
    log.info("closed %s (%s; %d bytes, %d records)", path, REASONS.get(reason, reason), size, records,
             extra=ev("file_closed", topic=topic, path=str(path), reason=reason, bytes=size, records=records))

#: handler threads shared by every topic (a batch is written to its file's buffer; a sync
#: fsyncs, so two let one topic sync while another writes)
HANDLER_THREADS = 2
#: threads for the lookups of a topic refresh and for stopping the topics
LOOKUP_THREADS = 2
STOP_THREADS = 4


def say_trimmed(path: Path, trimmed: int) -> None:
    log.warning("%s: cut %d byte%s of a torn last %s left by a crash (never FINed: nsqd delivers "
                "those messages again)", path, trimmed, "s" if trimmed != 1 else "",
                "gzip member" if path.name.endswith(".gz") else "record")


class TopicArchiver:
    """One topic: a Consumer, an ArchiveFile, and the un-FINed messages the file holds.
    ``formatter(msgs)`` gives the bytes of a batch's records, each with its separator."""

    def __init__(self, topic: str, channel: str, opts: FileOptions, formatter: Callable,
                 config: Config, nsqd: list[str], lookupd: list[str], on_error: Callable,
                 on_fatal: Callable, handlers: HandlerPool | None = None):
        self.topic = topic
        self.file = ArchiveFile(topic, opts, on_trim=say_trimmed,
                                on_close=lambda *a: say_closed(topic, *a))
        self.format = formatter
        self.on_fatal = on_fatal
        self.lock = threading.Lock()
        self.pending: list = []
        self.failed: BaseException | None = None
        self.received = 0
        self.finished = 0
        self.requeued = 0            # given back to nsqd because they were not durable (a write failed)
        self.cut_short = False       # its start was cut short by a signal
        self.announced = False       # "archiving topic" was said: stop() says its summary line
        self.started = False         # its consumer's start() returned
        self.last_received = 0.0     # time.time() of the last batch
        self.consumer = Consumer(topic, channel, batch_handler=self._on_batch, config=config,
                                 nsqd_tcp_addresses=nsqd, lookupd_http_addresses=lookupd,
                                 on_error=on_error, handlers=handlers)
        self.max_batch = max(1, config.max_in_flight)

    def start(self, fail_fast: bool, found: list[str] = ()) -> "TopicArchiver":
        self.consumer.start(fail_fast=fail_fast, found=found)
        self.started = True
        return self

    # -- consumer thread ----------------------------------------------------------------------
    def _on_batch(self, msgs: list) -> None:
        for m in msgs:
            m.auto_response = False  # FINed after the sync (disable_auto_response, inlined: hot path)
        with self.lock:
            self.last_received = time.time()
            if self.failed is not None:
                for m in msgs:
                    m.requeue(delay=0, backoff=False)
                self.requeued += len(msgs)
                return
            self.file.add(self.format(msgs), len(msgs))
            for m in msgs:  # its record is in the file's buffer; FIN or REQ needs only the id
                m.body = b""
            self.pending += msgs
            self.received += len(msgs)
            if len(self.pending) >= self.max_batch or self.consumer.is_starved():
                self._sync_locked()

    # -- any thread (with the lock) -------------------------------------------------------------
    def _sync_locked(self) -> None:
        if self.failed is not None:
            return
        try:
            self.file.sync()
        except OSError as e:
            self.failed = e
            for m in self.pending:  # not durable: give them back, never FIN
                m.requeue(delay=0, backoff=False)
            self.requeued += len(self.pending)
            self.pending = []
            self.on_fatal(self, e)
            return
        if self.pending:
            done, self.pending = self.pending, []
            lost = self.consumer.finish_many(done)  # lost: connection gone, nsqd redelivers
            self.finished += len(done) - len(lost)

    def tick(self, now: float, sync_interval: float) -> None:
        with self.lock:
            last = self.file.last_sync or self.file.opened_at or 0.0
            if self.pending and (now - last >= sync_interval or self.consumer.is_starved()):
                self._sync_locked()
            if self.failed is None:
                try:
                    self.file.maybe_rotate()  # said by the file's on_close
                except OSError as e:
                    self.failed = e
                    self.on_fatal(self, e)

    def sync_and_close(self, reason: str = "stop") -> None:
        """SIGHUP and stop: make everything durable, FIN it, close and move the file."""
        with self.lock:
            self._sync_locked()
            if self.failed is None:
                try:
                    self.file.close(reason)  # said by the file's on_close
                except OSError as e:
                    self.failed = e
                    self.on_fatal(self, e)

    def stop(self, timeout: float = 30.0, reason: str = "stop") -> None:
        """CLS, take what is still arriving, final sync + FIN, close, then stop the consumer."""
        self.consumer.drain(timeout)
        self.sync_and_close(reason)
        self.consumer.stop(timeout)
        if not self.announced and not self.received:  # it never ran: the interrupted line says it all
            return
        f = self.file
        t = self.consumer.totals()
        log.info("topic %s: %d messages archived and FINed in %d syncs, %d files closed; %d FINs lost "
                 "with their connection, %d late messages (nsqd redelivers both)", self.topic,
                 self.finished, f.syncs, f.closed, t["lost_responses"], t["late_messages"],
                 extra=ev("topic_stopped", topic=self.topic, finished=self.finished, syncs=f.syncs,
                          files_closed=f.closed, lost_responses=t["lost_responses"],
                          late_messages=t["late_messages"]))

    def counts(self) -> dict:
        """This topic's counts since it was added (RETIRED_KEYS)."""
        f = self.file
        t = self.consumer.totals()
        return {"received": self.received, "finished": self.finished, "requeued": self.requeued,
                "syncs": f.syncs, "closed": f.closed, "bytes_written": f.bytes_written,
                "timed_out": t["timed_out"], "lost_responses": t["lost_responses"],
                "late_messages": t["late_messages"]}


class Archiver:
    """Every topic's TopicArchiver, topic discovery, the sync/rotation timer, SIGHUP."""

    def __init__(self, *, topics: list[str], topic_pattern: str | None, topic_refresh: float,
                 channel: str, opts: FileOptions, formatter: Callable, config: Config,
                 nsqd: list[str], lookupd: list[str], sync_interval: float,
                 on_error: Callable = lambda e: log.warning("%s", e), status_interval: float = 0.0):
        self.fixed_topics = list(topics)
        self.pattern = re.compile(topic_pattern) if topic_pattern else None
        self.topic_refresh = topic_refresh
        self.channel = channel
        self.opts = opts
        self.formatter = formatter
        self.config = config
        self.nsqd = nsqd
        self.lookupd = lookupd
        self.sync_interval = sync_interval
        self.on_error = on_error
        self.topics: dict[str, TopicArchiver] = {}
        self.handlers = HandlerPool(HANDLER_THREADS, name="nsqcli-archive", ordered=True)  # nsqd's order in a file
        self._refused: set[str] = set()  # topics found whose file names would leave --output-dir
        self.fatal: BaseException | None = None
        self.fatal_topic: TopicArchiver | None = None
        self.write_errors = 0
        self._retired: dict[str, dict] = {}  # topic -> counts of its earlier subscriptions (removed)
        self._retired_last_fsync: float | None = None
        self._stopped: list[TopicArchiver] = []  # removed topics' archivers whose work file was not moved
        self.stop_event = threading.Event()
        self.hup_event = threading.Event()
        self._lock = threading.Lock()
        self._next_refresh = 0.0
        self.status_interval = status_interval
        self._next_status = time.monotonic() + status_interval
        self._status_last: dict[str, int] = {}
        self._timer: threading.Thread | None = None
        self._topics_thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> "Archiver":
        fdlimit.raise_soft_limit()  # one descriptor per connection, one per open file
        out = Path(self.opts.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.opts.work.mkdir(parents=True, exist_ok=True)
        for path in recover(self.opts.work, out, on_trim=say_trimmed):
            log.info("recovered %s from a previous run", path)
        for t in self.fixed_topics:
            self._add_topic(t, fail_fast=True)
        if self.pattern is not None and not self.stop_event.is_set():
            self._refresh_topics(first=True)
        if self.stop_event.is_set():  # interrupted (a signal during the start): stop() follows
            return self
        self._timer = threading.Thread(target=self._timer_loop, name="nsqcli-archiver", daemon=True)
        self._timer.start()
        if self.pattern is not None:  # lookupd polls and topic starts/stops block: not on the timer
            self._topics_thread = threading.Thread(target=self._topics_loop, name="nsqcli-topics",
                                                   daemon=True)
            self._topics_thread.start()
        return self

    def interrupt(self) -> None:
        """(stop_event is set) A signal came during start(): no topic starts from here on, and
        the handshakes of those starting fail at once (each then stops without its summary line)."""
        with self._lock:
            archivers = list(self.topics.values())
        for a in archivers:
            if not a.started:
                a.cut_short = True
            a.consumer.interrupt()

    def stop(self, timeout: float = 30.0) -> None:
        self.stop_event.set()
        for t in (self._timer, self._topics_thread):
            if t is not None and t.ident is not None:  # (a start cut short may not have started it)
                t.join(10)
        with self._lock:
            archivers = list(self.topics.values())
        from ..client.fanout import ask_all  # the topics stop side by side, on a few threads

        ask_all(archivers, lambda a: a.stop(timeout), timeout + 5, threads=STOP_THREADS, name=lambda a: a.topic)

    def _fatal(self, archiver: TopicArchiver, err: BaseException) -> None:
        self.write_errors += 1
        if self.fatal is None:
            self.fatal, self.fatal_topic = err, archiver
        self.stop_event.set()

    # -- topics -------------------------------------------------------------------------------------
    def _add_topic(self, topic: str, fail_fast: bool, found: list[str] = ()) -> None:
        """Start archiving ``topic``; ``found``: its nsqd as the lookupds just said (connected
        at once, not after the consumer's own first poll)."""
        a = TopicArchiver(topic, self.channel, self.opts, self.formatter, self.config, self.nsqd,
                          self.lookupd, self.on_error, self._fatal, handlers=self.handlers)
        with self._lock:  # known before it connects (interrupt(), stop()), unless stopping already
            if self.stop_event.is_set():
                return
            self.topics[topic] = a
        fdlimit.reserve(1)  # its file: never taken by a connection
        try:
            a.start(fail_fast=fail_fast, found=found)
        except NSQError:  # it failed, and left nothing behind (Consumer.start)
            with self._lock:
                self.topics.pop(topic, None)
            fdlimit.reserve(-1)
            raise
        if a.cut_short:  # interrupt() came during its start: stop() says what there is to say
            return
        again = " again" if topic in self._retired else ""
        # from here its summary is said, even when interrupt() marks it cut short after the look
        # above (it read `started` before the start returned): a topic said started is said stopped
        a.announced = True
        log.info("archiving topic %s%s", topic, again, extra=ev("topic_added", topic=topic, nsqd=list(found),
                                                               again=bool(again)))

    def _remove_topic(self, topic: str) -> None:
        with self._lock:
            a = self.topics.get(topic)
        if a is None:
            return
        pending, last = len(a.pending), a.last_received
        a.stop(reason="topic_gone")
        with self._lock:
            self.topics.pop(topic, None)
            self._retire(a)
        fdlimit.reserve(-1)
        ago = time.time() - last if last else None
        busy = pending or (ago is not None and ago < max(2 * self.topic_refresh, 10.0))
        what = (f"no message received" if ago is None else f"last message {ago:.1f}s ago") + \
            f", {a.received} archived by this subscription"
        fields = dict(topic=topic, pending=pending, last_message_seconds_ago=None if ago is None else round(ago, 3),
                      received=a.received)
        if busy:
            log.warning("topic %s disappeared (no nsqlookupd lists a producer for it): unsubscribed, file "
                        "closed, while it was receiving messages (%s%s): what its channel still holds stays "
                        "in nsqd until the topic is archived again", topic, what,
                        f"; {pending} buffered ones were synced first" if pending else "",
                        extra=ev("topic_removed", busy=True, **fields))
        else:
            log.info("topic %s disappeared (no nsqlookupd lists a producer for it): unsubscribed, file closed "
                     "(%s)", topic, what, extra=ev("topic_removed", busy=False, **fields))

    def _retire(self, a: TopicArchiver) -> None:
        """Keep a removed topic's counts (with the lock): never back to zero if it comes again."""
        old = self._retired.setdefault(a.topic, dict.fromkeys(RETIRED_KEYS, 0))
        for k, v in a.counts().items():
            old[k] += v
        if a.file.last_sync and (self._retired_last_fsync or 0) < a.file.last_sync:
            self._retired_last_fsync = a.file.last_sync
        if a.failed is not None:
            self._stopped.append(a)

    def lookupd_topics(self) -> set[str] | None:
        """Union of /topics over every lookupd, asked at once; None if none answered. Partial
        answers count for adding topics; removal needs every lookupd to have answered."""
        found: set[str] = set()
        answered = 0
        stopping = self.stop_event.is_set  # a stop (a signal during the start) ends the round early
        for a in ask_http(self.lookupd, lambda address: http_json(address, "/topics", timeout=5.0), 5.0, stopping):
            if a.error is not None:
                if not stopping():  # (then it is the stop's own Timeout, or nothing a user needs now)
                    self.on_error(a.error)
                continue
            found |= set((a.value or {}).get("topics") or [])
            answered += 1
        self._all_answered = answered == len(self.lookupd)
        return found if answered else None

    def _refresh_topics(self, first: bool = False) -> None:
        self._next_refresh = time.monotonic() + self.topic_refresh
        found = self.lookupd_topics()
        if self.stop_event.is_set():
            return
        if found is None:
            if first:
                raise NSQError("no nsqlookupd answered /topics: " + ", ".join(self.lookupd))
            return
        wanted = {t for t in found if self.pattern.search(t)} | set(self.fixed_topics)
        new = set()
        for t in sorted(wanted - set(self.topics)):
            escaping = escaping_name(t, self.opts)
            if escaping is None:
                new.add(t)
            elif t not in self._refused:
                self._refused.add(t)
                log.warning("topic %s not archived: its file name %r would leave --output-dir", t, escaping)
        # every topic's producers in one round (not one lookupd round per topic)
        produced = self._with_producers((set(self.topics) & wanted if self._all_answered else set()) | new)
        if self.stop_event.is_set():  # the stop ended the lookups early: their answers are not whole
            return
        if self._all_answered:  # never drop a topic on a partial view
            gone = set(self.topics) - wanted
            # nsqlookupd keeps listing a deleted (non-ephemeral) topic, with no producer left
            gone |= {t for t in set(self.topics) & wanted if t not in produced}
            for t in sorted(gone - set(self.fixed_topics)):
                self._remove_topic(t)
        for t in sorted(new & set(produced)):
            self._add_topic(t, fail_fast=False, found=produced[t])

    def _with_producers(self, topics: set[str]) -> dict[str, list[str]]:
        """Those of ``topics`` some nsqd carries according to a lookupd, or that a lookupd
        could not be asked about (never dropped on a failed lookup): every (topic, lookupd)
        asked at once."""
        from ..client.fanout import ask_all

        pairs = [(t, address) for t in sorted(topics) for address in self.lookupd]
        answers = ask_all(pairs, lambda p: lookup_topic(p[1], p[0], 5.0), 5.0, catch=LookupdError,
                          name=lambda p: p[1], threads=LOOKUP_THREADS, cancel=self.stop_event.is_set)
        produced: dict[str, list[str]] = {}
        for (t, _), a in zip(pairs, answers):
            if a.error is not None or a.value:  # kept: carried, or not known to be gone
                produced.setdefault(t, [])
                produced[t] += [p.tcp_address for p in a.value or () if p.tcp_address not in produced[t]]
        return produced

    # -- timer ----------------------------------------------------------------------------------------
    def _timer_loop(self) -> None:
        tick = max(0.05, min(1.0, self.sync_interval / 4))
        while not self.stop_event.wait(tick):
            try:
                now = time.time()
                with self._lock:
                    archivers = list(self.topics.values())
                if self.hup_event.is_set():
                    self.hup_event.clear()
                    n = sum(1 for a in archivers if a.file.is_open or a.file.pending)
                    log.info("SIGHUP: closing and moving %d file%s", n, "s" if n != 1 else "",
                             extra=ev("sighup", files=n))
                    for a in archivers:
                        a.sync_and_close("sighup")
                for a in archivers:
                    a.tick(now, self.sync_interval)
                if self.status_interval and time.monotonic() >= self._next_status:
                    self._log_status()
            except Exception as e:  # report and keep archiving
                self.on_error(e)

    def _topics_loop(self) -> None:
        """--topic-pattern: re-read the lookupds' topics every topic_refresh (own thread)."""
        while not self.stop_event.wait(max(0.05, self._next_refresh - time.monotonic())):
            try:
                self._refresh_topics()
            except Exception as e:  # report and keep archiving
                self.on_error(e)

    def _log_status(self) -> None:
        """A periodic line per topic for daemons without a terminal."""
        self._next_status = time.monotonic() + self.status_interval
        for row in self.status():
            if not row["active"]:
                continue
            before = self._status_last.get(row["topic"], 0)
            self._status_last[row["topic"]] = row["received"]
            log.info("topic %s: %d messages (%.1f/s), %d pending, file %s (%d bytes), %d syncs, %d files closed, "
                     "%d timed out, %d lost acks, %d late",
                     row["topic"], row["received"], (row["received"] - before) / self.status_interval,
                     row["pending"], row["file"] or "-", row["size"], row["syncs"], row["closed"],
                     row["timed_out"], row["lost_responses"], row["late_messages"])

    def status(self) -> list[dict]:
        """One row per topic archived since the start: counts cumulative over the process's life
        (a topic removed and found again goes on from its earlier counts); ``active`` False for
        a topic not archived now."""
        with self._lock:
            archivers = list(self.topics.values())
            retired = {t: dict(c) for t, c in self._retired.items()}
        rows = []
        for a in archivers:
            f = a.file
            counts = a.counts()
            for k, v in retired.pop(a.topic, {}).items():
                counts[k] += v
            rows.append({"topic": a.topic, "active": True, "file": f.name, "size": f.size, "pending": len(a.pending),
                         "last_sync": f.last_sync, **counts})
        for topic, counts in sorted(retired.items()):
            rows.append({"topic": topic, "active": False, "file": None, "size": 0, "pending": 0, "last_sync": None,
                         **counts})
        return rows

    def totals(self) -> dict:
        """Archiver-wide, cumulative (metrics): bytes_written, fsyncs, files_rotated (closed and
        moved), last_fsync (epoch seconds or None), write_errors."""
        rows = self.status()
        with self._lock:
            syncs = [a.file.last_sync for a in self.topics.values() if a.file.last_sync]
        if self._retired_last_fsync:
            syncs.append(self._retired_last_fsync)
        return {"bytes_written": sum(r["bytes_written"] for r in rows), "fsyncs": sum(r["syncs"] for r in rows),
                "files_rotated": sum(r["closed"] for r in rows), "last_fsync": max(syncs, default=None),
                "write_errors": self.write_errors}

    def fatal_message(self) -> str:
        """What stopped the run (call after stop()): the path that failed, what happened, and
        the fate of the messages - requeued (not durable) vs already on disk and FINed."""
        a, e = self.fatal_topic, self.fatal
        if e is None:
            return ""
        why = getattr(e, "strerror", None) or str(e)
        rows = self.status()
        finished = sum(r["finished"] for r in rows)
        requeued = sum(r["requeued"] for r in rows)
        with self._lock:
            every = list(self.topics.values()) + self._stopped
        unmoved = sorted({str(x.file.unmoved) for x in every if x.file.unmoved is not None and x.file.unmoved.exists()})
        op, path = (a.file.failure if a is not None and a.file.failure else ("write", str(getattr(e, "filename", "") or "?")))
        fate = (f"{requeued} message{'s' if requeued != 1 else ''} not yet on disk "
                f"{'were' if requeued != 1 else 'was'} requeued (nsqd delivers them again); "
                f"{finished} earlier {'ones are' if finished != 1 else 'one is'} on disk and FINed")
        left = (f"; left in --work-dir (the next start moves {'them' if len(unmoved) > 1 else 'it'} into "
                f"--output-dir): {', '.join(unmoved)}") if unmoved else ""
        if op == "move":
            text = (f"cannot move a closed archive file into --output-dir: {path}: {why}. The messages in it were "
                    f"fsync'ed and FINed before the move: nothing of it is lost{left}. In all {fate}")
        elif op == "open":
            text = f"cannot create the archive file {path}: {why}. Nothing was written to it: {fate}{left}"
        else:
            text = f"cannot write the archive ({op} of {path}): {why}. {fate}{left}"
        if getattr(e, "errno", None) in FULL:
            text += (". Free space (or raise the limit) before it starts again: a restart now fails again "
                     "(under systemd, slow the restarts down: RestartSec=30s, RestartSteps=5, RestartMaxDelaySec=10min)")
        return text
