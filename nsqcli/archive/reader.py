"""Archives back into records: what ``nsqcli to-file`` or ``nsq_to_file`` wrote.

    for rec in read_archive(["/archive/*.log.gz", "/archive/2026-11/"]):
        rec.body, rec.topic, rec.timestamp ...

Files, directories (recursively, in name order) and globs; gzip or not (by the magic bytes:
concatenated members, as to-file writes them, are read through); raw (one record per line, as
nsq_to_file writes bodies) or JSON (the NDJSON envelope of ``--format json``), detected per file
from its first record unless given. A raw body that contained a newline cannot be told apart from
two records: use ``--format json`` archives for binary or multi-line bodies.

A gzip file whose last member is torn (a crash while writing, before recovery trimmed it) yields
every complete record before the tear, then reports the file through ``on_error``.
"""

from __future__ import annotations

import glob
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from ..records import envelope_body, split_records

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 20


class ArchivedMessage(NamedTuple):
    """One archived message. Raw archives only know the body (and the file)."""

    body: bytes
    topic: str | None = None
    channel: str | None = None
    nsqd: str | None = None
    id: str | None = None
    timestamp: int | None = None   # ns since the epoch (JSON envelope)
    attempts: int | None = None
    file: str | None = None


def archive_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files, directories (recursive) and globs into a sorted list of files. A path that
    matches nothing raises FileNotFoundError naming it."""
    out: list[Path] = []
    for p in paths:
        p = str(p)
        matches = sorted(glob.glob(p, recursive=True)) if glob.has_magic(p) else [p]
        if not matches or not all(os.path.exists(m) for m in matches):
            raise FileNotFoundError(2, "no such archive file or directory", p)
        for m in matches:
            path = Path(m)
            if path.is_dir():
                out += sorted(f for f in path.rglob("*") if f.is_file() and not f.name.startswith("."))
            else:
                out.append(path)
    return list(dict.fromkeys(out))


#: a gzip member's lines are held until the member is complete, up to this much output (then
#: streamed: nsq_to_file writes a whole file as one member)
MEMBER_HOLD = 8 * 1024 * 1024


def _lines(path: Path, on_error: Callable[[str], None]) -> Iterator[bytes]:
    """Raw lines (without the newline) of a plain or gzip file, streamed in bounded memory."""
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
        chunks = iter(lambda: f.read(CHUNK), b"")
        yield from split_records(_gunzip(chunks, path, on_error) if gz else chunks)


def _gunzip(chunks: Iterator[bytes], path: Path, on_error: Callable[[str], None]) -> Iterator[bytes]:
    """Concatenated gzip members -> data. A member's data is released when the member is
    complete (or past MEMBER_HOLD bytes); a torn or corrupt last member is reported and dropped:
    what it held was never FINed by to-file, so nsqd delivered it again."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    held: list[bytes] = []
    size = 0
    fed = False  # the current member has started
    try:
        for chunk in chunks:
            while chunk:
                fed = True
                out = d.decompress(chunk)
                held.append(out)
                size += len(out)
                if d.eof:
                    yield b"".join(held)
                    held, size = [], 0
                    chunk = d.unused_data
                    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    fed = False
                else:
                    chunk = b""
                    if size > MEMBER_HOLD:
                        yield b"".join(held)
                        held, size = [], 0
    except zlib.error as e:
        on_error(f"{path}: corrupt gzip data after the last complete record ({e}); the rest is skipped")
        return
    if fed and not d.eof:
        on_error(f"{path}: torn gzip member at the end (a crash while writing); its records are skipped")


def _is_envelope(line: bytes) -> bool:
    try:
        d = json.loads(line)
    except ValueError:
        return False
    return isinstance(d, dict) and ("body" in d or "body_base64" in d) and "timestamp" in d


def read_archive(paths: Iterable[str | os.PathLike], fmt: str = "auto",
                 on_error: Callable[[str], None] | None = None) -> Iterator[ArchivedMessage]:
    """Every record of every archive file, in file order. ``fmt``: "auto", "raw" or "json".
    A JSON line that is not an envelope raises ValueError naming the file and line."""
    if fmt not in ("auto", "raw", "json"):
        raise ValueError(f"unknown archive format {fmt!r} (auto, raw, json)")
    report = on_error or (lambda text: None)
    for path in archive_files(paths):
        kind = None if fmt == "auto" else fmt
        for n, line in enumerate(_lines(path, report), 1):
            if kind is None:
                if not line:
                    continue
                kind = "json" if _is_envelope(line) else "raw"
            if not line:  # nsqd has no empty messages: a blank line is no record
                continue
            if kind == "raw":
                yield ArchivedMessage(line, file=str(path))
                continue
            try:
                d = json.loads(line)
                yield ArchivedMessage(envelope_body(line), d.get("topic"), d.get("channel"), d.get("nsqd"), d.get("id"),
                             d.get("timestamp"), d.get("attempts"), str(path))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{path}:{n}: not a JSON envelope ({e})") from None


def detect_format(paths: Iterable[str | os.PathLike]) -> str | None:
    """"json" or "raw" from the first record of the first non-empty file (None: no record yet)."""
    for path in archive_files(paths):
        for line in _lines(path, lambda text: None):
            if line:
                return "json" if _is_envelope(line) else "raw"
    return None
