"""``nsqcli mpub``: publish many records from files or stdin, in pipelined MPUB batches."""

from __future__ import annotations

import sys
import time

import click

from .options import build_config, connection_options, pop_connection
from .pub import resolve_producers
from .types import DELIMITER, DURATION, TOPIC

CHUNK = 1 << 20


def read_records(stream, delimiter: bytes):
    """Yield records split by one delimiter byte. A missing final delimiter keeps the last
    record whole (the official to_nsq drops its last byte). Empty records are yielded as b""."""
    rest = b""
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            break
        parts = (rest + chunk).split(delimiter)
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


class Stats:
    def __init__(self):
        self.records = self.published = self.skipped_empty = self.skipped_invalid = self.bytes = 0
        self.start = time.monotonic()

    def summary(self, failed: int) -> str:
        dt = max(time.monotonic() - self.start, 1e-9)
        return (f"published {self.published}, skipped {self.skipped_empty} empty"
                f"{f' + {self.skipped_invalid} invalid' if self.skipped_invalid else ''}, failed {failed}, "
                f"{dt:.2f}s, {self.published / dt:,.0f} msg/s")


class RateLimiter:
    """Token bucket: ``rate`` tokens per second, burst of one second."""

    def __init__(self, rate: float):
        self.rate = rate
        self.tokens = 1.0
        self.last = time.monotonic()

    def take(self, n: int) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= n or (n > self.rate and self.tokens >= self.rate):
                self.tokens -= n
                return
            time.sleep(min(1.0, (n - self.tokens) / self.rate))


@click.command()
@click.option("-t", "--topic", required=True, type=TOPIC, help="Topic to publish to.")
@click.argument("files", nargs=-1, type=click.File("rb"))
@click.option("-d", "--delimiter", type=DELIMITER, default="\\n", show_default=True,
              help="Record separator: one byte or an escape (\\n, \\0, \\t, \\x1e).")
@click.option("-0", "--null", is_flag=True, help="Records are separated by NUL (same as -d '\\0').")
@click.option("-f", "--format", "fmt", type=click.Choice(["raw", "json"]), default="raw", show_default=True,
              help="json: each record is the NDJSON envelope written by 'tail --format json'.")
@click.option("--batch-size", type=click.IntRange(1, 100000), default=500, show_default=True,
              help="Messages per MPUB (also bounded by --max-body-size).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="At most N messages per second.")
@click.option("--defer", type=DURATION, help="Deliver each message after this delay (DPUB per message).")
@click.option("--skip-invalid", is_flag=True,
              help="Skip (and count) records over --max-msg-size or unparsable JSON instead of stopping.")
@click.option("--skip", type=click.IntRange(0), default=0,
              help="Skip the first N records (to resume after a failed run: it says which N).")
@click.option("--max-msg-size", type=click.IntRange(1), default=1024 * 1024, show_default=True,
              help="nsqd's --max-msg-size; larger records are invalid.")
@click.option("--max-body-size", type=click.IntRange(1), default=5 * 1024 * 1024, show_default=True,
              help="nsqd's --max-body-size; MPUB batches stay below it.")
@connection_options()
@click.pass_obj
def mpub(app, topic, files, delimiter, null, fmt, batch_size, rate, defer, skip_invalid, skip,
         max_msg_size, max_body_size, **kwargs):
    """Publish every record of FILES (or stdin) to TOPIC.

    Prints a summary on stderr: published, skipped, failed, elapsed, rate. Exit 0 only when
    every record was published (nsqd said OK to every batch); otherwise exit 1 saying how many
    were published before the failure.
    """
    from ..errors import NSQError, PublishError
    from ..client.producer import Producer
    from ..archive.formats import envelope_body

    conn = pop_connection(kwargs)
    cfg = build_config(conn, max_msg_size=max_msg_size, max_body_size=max_body_size)
    if null:
        delimiter = b"\0"
    sources = list(files) or [sys.stdin.buffer]
    stats = Stats()
    limiter = RateLimiter(rate) if rate else None
    producer = Producer(resolve_producers(app, conn, topic), cfg)
    progress = _Progress(app, stats, sources) if app.stderr_is_tty else None
    batch: list[bytes] = []
    recnos: list[int] = []  # record number (1-based) of each body in batch
    batch_bytes = 4
    per_flush = batch_size * 8  # up to 8 MPUBs in flight per flush

    def flush() -> None:
        nonlocal batch, recnos, batch_bytes
        if not batch:
            return
        if limiter:
            limiter.take(len(batch))
        done = 0
        try:
            if defer is not None:
                for body in batch:
                    producer.publish(topic, body, defer=defer)
                    done += 1
            else:
                done = producer.multi_publish(topic, batch, batch_size=batch_size, window=8).published
        except PublishError as e:
            done += e.published if defer is None else 0
            stats.published += done
            raise PublishError(f"{e.cause or e}; {stats.published} records acknowledged in this run, "
                               f"record {recnos[done]} and later were not: resume with --skip {recnos[done] - 1}",
                               stats.published, len(batch) - done, e.cause) from None
        stats.published += done
        batch, recnos, batch_bytes = [], [], 4
        if progress:
            progress.update()

    def stop_at(reason: str) -> None:
        flush()
        raise NSQError(f"record {stats.records} {reason}: stopped; the {stats.published} records before it "
                       f"were published, it and the rest were not (resume with --skip {stats.records - 1}, "
                       "or use --skip-invalid)")

    try:
        for src in sources:
            for rec in read_records(src, delimiter):
                stats.records += 1
                if stats.records <= skip:
                    continue
                if not rec:
                    stats.skipped_empty += 1
                    continue
                if fmt == "json":
                    try:
                        rec = envelope_body(rec)
                    except (ValueError, KeyError, TypeError) as e:
                        if not skip_invalid:
                            stop_at(f"is not a JSON envelope ({e})")
                        stats.skipped_invalid += 1
                        continue
                    if not rec:
                        stats.skipped_empty += 1
                        continue
                if len(rec) > max_msg_size:
                    if not skip_invalid:
                        stop_at(f"is {len(rec)} bytes, over --max-msg-size {max_msg_size}")
                    app.warn(f"skipping record {stats.records}: {len(rec)} bytes > --max-msg-size {max_msg_size}")
                    stats.skipped_invalid += 1
                    continue
                stats.bytes += len(rec)
                if len(batch) >= per_flush:
                    flush()
                batch.append(rec)
                recnos.append(stats.records)
        flush()
    except NSQError:
        app.info(stats.summary(max(0, stats.records - skip - stats.published - stats.skipped_empty
                                   - stats.skipped_invalid)))
        raise
    finally:
        if progress:
            progress.stop()
        producer.close()
    app.info(stats.summary(0))
    return 0


class _Progress:
    """A rich progress bar on stderr (TTY only): records, bytes, rate, ETA for files."""

    def __init__(self, app, stats: Stats, sources):
        import os

        from rich.progress import (BarColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        total = None
        try:
            total = sum(os.fstat(s.fileno()).st_size for s in sources) or None
        except (OSError, ValueError):
            pass
        self.stats = stats
        self.progress = Progress(TextColumn("{task.fields[records]} records"), BarColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(), console=app.console)
        self.task = self.progress.add_task("mpub", total=total, records=0)
        self.progress.start()

    def update(self) -> None:
        self.progress.update(self.task, completed=self.stats.bytes, records=self.stats.published)

    def stop(self) -> None:
        self.progress.stop()
