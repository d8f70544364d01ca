"""The nsq sink's accounting: what each task attempt acknowledged (``commitReportPath``), and the
driver's one line and JSON report for a commit or an abort, which never say a count they do not
know (see nsqcli.spark.sink). No pyspark here.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

from . import options as opt

ATTEMPTS = ".attempts"
#: how often a task attempt updates its record as OKs come (and once more at its end)
RECORD_EVERY = 1.0


def report_path(options, streaming: bool) -> str | None:
    """commitReportPath, checked and made on the driver: a batch write's report FILE (replaced
    by each write), a streaming query's report DIRECTORY (``<batchId>.json`` per micro-batch).
    A local path (``file:`` allowed); on a cluster, a mount every executor shares."""
    raw = opt.string(options, "commitReportPath")
    if raw is None:
        return None
    path = raw
    if "://" in raw or raw[:5].lower() == "file:":
        scheme, _, rest = raw.partition(":")
        if scheme.lower() != "file" or not rest.startswith("/"):
            raise opt.OptionError(f"option 'commitReportPath' must be a local path (or file:/...), written by the "
                                  f"driver and every executor (on a cluster: a shared mount), not {raw!r}")
        path = "/" + rest.lstrip("/")
    path = os.path.abspath(os.path.expanduser(path))
    where = path if streaming else os.path.dirname(path)
    if not streaming and os.path.isdir(path):
        raise opt.OptionError(f"option 'commitReportPath': {raw!r} is a directory; a batch write's report is "
                              "one JSON file (a streaming query's is a directory)")
    try:
        os.makedirs(where, exist_ok=True)
        probe = os.path.join(where, f".nsqcli-probe-{uuid.uuid4().hex}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise opt.OptionError(f"option 'commitReportPath': cannot write in {where}: "
                              f"{e.strerror or e}") from None
    return path


def attempts_dir(report: str, key: str, streaming: bool) -> str:
    """Where the task attempts of one write (``key``: the writer's id) or micro-batch (the batch
    id) keep their records."""
    if streaming:
        return os.path.join(report, ATTEMPTS, key)
    return os.path.join(os.path.dirname(report), ATTEMPTS, f"{os.path.basename(report)}.{key}")


def write_atomically(path: str, doc: dict) -> None:
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.write("\n")
    os.replace(tmp, path)


class AttemptRecord:
    """This task attempt's record under commitReportPath: what nsqd acknowledged so far
    (``final`` once the attempt ended, succeeded or not). Written before anything is published:
    an attempt with no record published nothing."""

    def __init__(self, directory: str, partition: int, attempt: int):
        self.id = uuid.uuid4().hex
        self.path = os.path.join(directory, f"p{partition}-a{attempt}-{self.id}.json")
        self.doc = {"id": self.id, "partition": partition, "attempt": attempt, "acknowledged": 0,
                    "final": False, "error": None, "nsqd": [], "resent": 0}
        self.last = 0.0
        try:
            os.makedirs(directory, exist_ok=True)
            self.save()
        except OSError as e:
            raise RuntimeError(f"nsq sink, partition {partition}: cannot write its record under commitReportPath "
                               f"({directory}): {e.strerror or e}; nothing was published") from None

    def save(self) -> None:
        write_atomically(self.path, self.doc)
        self.last = time.monotonic()

    def progress(self, acked: int) -> None:
        self.doc["acknowledged"] = acked
        if time.monotonic() - self.last >= RECORD_EVERY:
            try:
                self.save()
            except OSError:
                pass  # stays behind: the driver reads a count that is not final as "at least"

    def end(self, m) -> None:  # m: sink.NSQCommitMessage
        self.doc.update(acknowledged=m.messages, final=True, error=m.error, nsqd=m.nsqd, resent=m.resent)
        try:
            self.save()
        except OSError:
            pass


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def read_records(directory: str) -> list[dict]:
    """The task attempts' records of one write or micro-batch (see AttemptRecord)."""
    out = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue  # torn or gone: a record is replaced atomically, so this is not one of ours
    return out


def settle(messages, records: list[dict] | None, committed: bool, what: str) -> tuple[str, dict]:
    """The driver's one line (and the report's document) for a commit or an abort.

    ``messages``: Spark's commit messages, None for a failed task. ``records``: the attempts'
    records under commitReportPath, or None without one. Every number said is known: the
    committed tasks' acknowledged counts exactly; the failed attempts' from their records
    ("at least" while one was not final: an attempt still running, or killed); without
    records, that more landed, not how many."""
    done = [m for m in messages if m is not None]
    failed_tasks = [i for i, m in enumerate(messages) if m is None]
    total = sum(m.messages for m in done)
    nbytes = sum(m.bytes for m in done)
    retries = sum(m.retries for m in done)
    resent = sum(m.resent for m in done)
    rerun = [m for m in done if m.attempt > 0]
    nsqd = {a for m in done for a in m.nsqd}
    ids = {m.attempt_id for m in done}
    others = [r for r in records if r.get("id") not in ids] if records is not None else []
    extra = sum(int(r.get("acknowledged") or 0) for r in others)
    exact = all(r.get("final") for r in others)
    resent += sum(int(r.get("resent") or 0) for r in others)
    nsqd |= {a for r in others for a in r.get("nsqd") or ()}
    to = ", ".join(sorted(nsqd)) or "no nsqd"

    if committed:
        line = (f"nsqcli.spark: {what}: published {total} messages ({nbytes} bytes) in "
                f"{_plural(len(done), 'partition')} to {to}")
        if retries:
            line += f" after {_plural(retries, 'retry', 'retries')}"
    else:
        line = (f"nsqcli.spark: {what}: nsqd acknowledged {total} messages from the "
                f"{_plural(len(done), 'task')} that finished" if done else f"nsqcli.spark: {what}: no task finished")
    failed_before = bool(rerun or failed_tasks or others)
    if failed_before:
        line += _after_failures(failed_tasks, rerun, others if records is not None else None, total, extra, exact)
    if resent:
        line += (f"; up to {resent} more may be in nsqd (taken by a connection that was lost before nsqd's "
                 "answer, and sent again)")
    known = records is not None or not failed_before
    doc = {
        "state": "committed" if committed else "aborted",
        "topic": None,
        "published": total, "bytes": nbytes,
        "failed_attempts_acknowledged": extra if records is not None else None,
        "acknowledged": total + extra if known else None,
        "exact": known and exact,
        "may_be_duplicates": resent,
        "partitions": _partitions(done),
        "failed_tasks": failed_tasks,
        "rerun_tasks": sorted(m.partition for m in rerun),
        "failed_attempts": _failed_attempts(others),
        "nsqd": sorted(nsqd),
        "line": line,
        "time": time.time(),
    }
    return line, doc


def _after_failures(failed_tasks: list, rerun: list, others: list | None, total: int, extra: int,
                    exact: bool) -> str:
    """The line's part for tasks that failed or ran again: what their failed attempts published
    (``others``: their records, None without commitReportPath: then only that more landed)."""
    who = []
    if failed_tasks:
        who.append(f"{_plural(len(failed_tasks), 'task')} failed")
    if rerun:
        who.append(f"{_plural(len(rerun), 'task')} ran again after failed attempts")
    who = " and ".join(who)
    if others is None:
        return (f"; {who}, which published an unknown number more (at least once: nsqd holds at least "
                f"{total}; option commitReportPath counts them)")
    least = "" if exact else "at least "
    attempts = _plural(len(others), "failed attempt")
    return (f"; {who}: {attempts} published {least}{extra} more (at least once): nsqd acknowledged "
            f"{least}{total + extra} in all")


def _partitions(done: list) -> list[dict]:
    return [{"partition": m.partition, "messages": m.messages, "bytes": m.bytes, "attempt": m.attempt,
             "retries": m.retries, "resent": m.resent, "nsqd": m.nsqd, "seconds": round(m.seconds, 3)}
            for m in sorted(done, key=lambda m: m.partition)]


def _failed_attempts(others: list) -> list[dict]:
    return [{k: r.get(k) for k in ("partition", "attempt", "acknowledged", "final", "error", "resent", "nsqd")}
            for r in sorted(others, key=lambda r: (r.get("partition", 0), r.get("attempt", 0)))]


def finish(topic: str | None, messages, committed: bool, what: str, records_dir: str | None,
           report: str | None, **about) -> None:
    """The driver's commit or abort: the line on stderr and, with commitReportPath, the report
    (then the attempts' records go)."""
    records = read_records(records_dir) if records_dir else None
    line, doc = settle(messages, records, committed, what)
    doc.update(topic=topic, **about)
    print(line, file=sys.stderr, flush=True)
    if report is None:
        return
    try:
        write_atomically(report, doc)
    except OSError as e:
        print(f"nsqcli.spark: could not write the commit report {report}: {e.strerror or e}",
              file=sys.stderr, flush=True)
        return
    import shutil

    shutil.rmtree(records_dir, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(records_dir))  # .attempts, when no other write is using it
    except OSError:
        pass
