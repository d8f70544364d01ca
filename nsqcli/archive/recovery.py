"""Crash recovery of the archive work directory (``nsqcli to-file`` at start-up).

A kill -9 can leave a file in ``work_dir`` whose tail was being written: :func:`recover` trims it
back to its last complete record (raw: the last newline) or gzip member, and moves it into
``output_dir``. Everything it trims was never FINed, so nsqd delivers it again (at-least-once).
Linear in the file size whatever the number of gzip members (bench/recovery.py).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from .files import move_into


def valid_gzip_prefix(data: bytes, chunk: int = 64 * 1024) -> int:
    """Length of the longest prefix of ``data`` made of complete gzip members.

    Linear in len(data) whatever the number of members: input is fed in ``chunk``-sized
    memoryview slices (never the whole rest of the file per member) and output is bounded
    per call and thrown away."""
    view = memoryview(data)
    n = len(data)
    good = pos = 0
    while pos < n:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while pos < n and not d.eof:
            piece = view[pos:pos + chunk]
            try:
                buf = piece
                while True:
                    d.decompress(buf, 1 << 20)
                    buf = d.unconsumed_tail
                    if d.eof or not buf:
                        break
            except zlib.error:
                return good
            pos += len(piece) - (len(d.unused_data) if d.eof else 0)
        if not d.eof:
            return good
        good = pos
    return good


def whole_records_size(f, chunk: int = 64 * 1024) -> int:
    """Length of the prefix of the open file ``f`` that ends at its last newline (0 if none):
    read backwards from the end, so the cost is the torn tail, not the file."""
    end = os.fstat(f.fileno()).st_size
    pos = end
    while pos > 0:
        start = max(0, pos - chunk)
        f.seek(start)
        i = f.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def whole_members_size(f) -> int:
    """Length of the prefix of the open file ``f`` made of complete gzip members (mmap'ed:
    linear time, memory bounded by the page cache)."""
    import mmap

    size = os.fstat(f.fileno()).st_size
    if size == 0:
        return 0
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return valid_gzip_prefix(m)


def trim_torn_tail(path: Path, gzip: bool | None = None) -> int:
    """Cut ``path`` back to its whole records (raw: up to the last newline; gzip: its complete
    members), fsync, and return how many bytes were cut (0 when the file was whole). A crash or
    a power loss in the middle of a write leaves such a tail; left there, the next run's records
    would be glued onto it."""
    if gzip is None:
        gzip = str(path).endswith(".gz")
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0
        if not gzip:
            f.seek(size - 1)
            if f.read(1) == b"\n":  # the common case: O(1)
                return 0
        keep = whole_members_size(f) if gzip else whole_records_size(f)
        if keep == size:
            return 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


def recover(work_dir: Path, output_dir: Path, on_trim=None) -> list[Path]:
    """Trim leftover work files (from a crash) to their last complete record or gzip member and
    move them into output_dir; ``on_trim(path, n)`` is told each file that lost a torn tail of n
    bytes. Only used when work_dir != output_dir (without a work dir, ArchiveFile trims the files
    it appends to or follows)."""
    moved: list[Path] = []
    if not work_dir.is_dir() or work_dir.resolve() == output_dir.resolve():
        return moved
    for path in sorted(p for p in work_dir.rglob("*") if p.is_file()):
        name = str(path.relative_to(work_dir))
        trimmed = trim_torn_tail(path, name.endswith(".gz"))
        if trimmed and on_trim is not None:
            on_trim(path, trimmed)
        if path.stat().st_size == 0:
            path.unlink()
            continue
        moved.append(move_into(path, output_dir, name))
    return moved
