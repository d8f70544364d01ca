"""Durable file moves of the archive: link into the output directory without overwriting,
fsync the directories. Used by the writer (rotation) and by crash recovery."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_into(path: Path, output_dir: Path, name: str) -> Path:
    """Link ``path`` to ``output_dir/name`` without ever overwriting (a taken name gets a
    ``.N`` suffix before the extension), unlink the source, fsync both directories."""
    dest = output_dir / name
    if dest.resolve() == path.resolve():  # work dir is the output dir
        return path
    dest.parent.mkdir(parents=True, exist_ok=True)
    stem, dot, ext = name.rpartition(".")
    i = 0
    while True:
        try:
            os.link(path, dest)
            break
        except FileExistsError:
            i += 1
            dest = output_dir / (f"{stem}.{i}.{ext}" if dot else f"{name}.{i}")
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            raise OSError(e.errno, f"--work-dir and --output-dir must be on the same filesystem ({e.strerror})",
                          str(path))
    os.unlink(path)
    fsync_dir(dest.parent)
    fsync_dir(path.parent)
    return dest


def check_writable_dir(path: str) -> None:
    """At start-up, before anything is consumed: prove ``path`` can be created and a file
    created in it, leaving nothing behind. Raises OSError saying why not (a file, no
    permission, read-only)."""
    d = Path(path)
    created = [p for p in (d, *d.parents) if not p.exists()]
    try:
        d.mkdir(parents=True, exist_ok=True)
        # O_EXCL with our pid and a counter, not tempfile.mkstemp: tempfile imports shutil,
        # random, bz2 and lzma - 1.3 MB of the daemon's RSS for one probe
        for n in range(100):
            probe = d / f".nsqcli-probe-{os.getpid()}-{n}"
            try:
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(errno.EEXIST, "cannot create a probe file (100 names taken)", str(d))
        os.close(fd)
        os.unlink(probe)
    finally:  # leave no trace: a later start-up check may still refuse (the archiver creates them)
        for p in created:
            try:
                p.rmdir()
            except OSError:
                pass
