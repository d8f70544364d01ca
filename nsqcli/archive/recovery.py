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

from .writer import move_into


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


def recover(work_dir: Path, output_dir: Path) -> list[Path]:
    """Trim leftover work files (from a crash) to their last complete record or gzip member and
    move them into output_dir. Only used when work_dir != output_dir."""
    moved = []
    if not work_dir.is_dir() or work_dir.resolve() == output_dir.resolve():
        return moved
    for path in sorted(p for p in work_dir.rglob("*") if p.is_file()):
        name = str(path.relative_to(work_dir))
        data = path.read_bytes()
        keep = valid_gzip_prefix(data) if name.endswith(".gz") else data.rfind(b"\n") + 1
        if keep != len(data):
            with open(path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
        if keep == 0:
            path.unlink()
            continue
        moved.append(move_into(path, output_dir, name))
    return moved
