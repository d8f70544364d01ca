"""The archive writer behind ``nsqcli to-file``: naming, rotation, gzip, fsync, atomic moves.

Durability contract (what makes "FIN only what is on disk" possible):

- Records are buffered in memory and reach the file only in :meth:`ArchiveFile.sync`, which
  writes them (as ONE complete gzip member when compressing), flushes, and fsyncs. So between
  syncs a file is always a sequence of complete records / complete gzip members; a reader can
  decompress it to the end at any moment after a sync.
- Files are written in ``work_dir`` and, when closed, linked into ``output_dir`` (link + unlink:
  never overwrites; a taken name bumps <REV>) and both directories are fsync'ed.
- A crash can leave a file in ``work_dir`` whose tail was being written: recovery.recover trims it
  back to the last complete record / gzip member and moves it out. Everything it trims was never
  FINed, so nsqd delivers it again (at-least-once).

Naming follows nsq_to_file: ``--filename-format`` tokens <TOPIC> <HOST> <REV> <DATETIME> <PID>,
<REV> = ``-%06d`` (removed when no rotation, gzip or separate work dir needs it). <DATETIME> is
``strftime(--datetime-format)`` in UTC unless ``local_time``; Python's strftime leaves literal text
literal (nsq_to_file's Go layout shim does not).
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import socket
import time
from collections import deque
from pathlib import Path

from ..client.record import Record
from .files import fsync_dir, move_into

DEFAULT_FILENAME_FORMAT = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
DEFAULT_DATETIME_FORMAT = "%Y-%m-%d_%H"


class FileOptions(Record, frozen=True):
    output_dir: str = "/tmp"
    work_dir: str | None = None
    filename_format: str = DEFAULT_FILENAME_FORMAT
    datetime_format: str = DEFAULT_DATETIME_FORMAT
    host_identifier: str | None = None
    local_time: bool = False
    gzip: bool = False
    gzip_level: int = 6
    rotate_size: int = 0           # bytes on disk (compressed when compressing); 0 = off
    rotate_interval: float = 0.0   # seconds since the file was opened; 0 = off
    skip_empty_files: bool = False  # accepted for nsq_to_file compatibility: files open lazily,
                                    # so nsqcli never leaves an empty file anyway

    @property
    def work(self) -> Path:
        return Path(self.work_dir or self.output_dir)

    @property
    def needs_rev(self) -> bool:
        return bool(self.gzip or self.rotate_size or self.rotate_interval or
                    (self.work_dir and Path(self.work_dir).resolve() != Path(self.output_dir).resolve()))

    def validate(self) -> None:
        if not 1 <= self.gzip_level <= 9:
            raise ValueError("--gzip-level must be 1-9")
        if self.needs_rev and "<REV>" not in self.filename_format:
            raise ValueError("--filename-format needs <REV> with --gzip, --rotate-size, --rotate-interval "
                             "or a separate --work-dir (so a new file never overwrites an old one)")
        if "<TOPIC>" not in self.filename_format:
            raise ValueError("--filename-format needs <TOPIC>")
        if self.host_identifier and "/" in self.host_identifier:
            raise ValueError(f"--host-identifier {self.host_identifier!r} has a '/': it goes into file names "
                             "(put directories in --filename-format)")
        if self.host_identifier and any(ord(c) < 32 or ord(c) == 127 for c in self.host_identifier):
            raise ValueError(f"--host-identifier {self.host_identifier!r} has a control character: it goes into "
                             "file names")
        if leaves_dir(self.filename_format):
            raise ValueError(f"--filename-format {self.filename_format!r} leaves --output-dir: give a path "
                             "inside it (no leading '/', no '..')")


def leaves_dir(name_format: str) -> bool:
    """True when names made from ``name_format`` would not stay under the directory they are
    made in (an absolute path, or '..' climbing out)."""
    import posixpath

    probe = re.sub(r"<[A-Z_]+>", "x", name_format)
    return posixpath.isabs(probe) or posixpath.normpath(probe).split("/")[0] == ".."


def escaping_name(topic: str, opts: "FileOptions") -> str | None:
    """The file name ``topic`` would get now, if it leaves the directory (a topic named '..'
    in '<TOPIC>/x.log', a '/../' in --datetime-format or --host-identifier), else None."""
    name = ArchiveFile(topic, opts).raw_name(time.time(), 0)
    return name if leaves_dir(name) else None


def short_host() -> str:
    return socket.gethostname().split(".")[0]


class ArchiveFile:
    """One topic's current archive file. Not thread-safe: the caller holds a lock."""

    def __init__(self, topic: str, opts: FileOptions, clock=time.time, on_trim=None, on_close=None):
        self.topic = topic
        self.opts = opts
        self.clock = clock
        self.on_trim = on_trim             # (path, bytes) when a torn tail left by a crash was cut
        self.on_close = on_close           # (final path, reason, bytes, records) when a file was closed
        self._checked: set[Path] = set()   # files of earlier runs already checked for a torn tail
        self._scanned = False              # the newest earlier file of this topic was checked
        self._records: list[bytes] = []
        self._count = 0
        self._fd: int | None = None
        self.path: Path | None = None      # in work dir
        self.name: str | None = None       # relative name (may contain '/')
        self._base: str | None = None      # name without REV, to know when DATETIME rolled
        self._rev = 0
        self.opened_at = 0.0
        self.size = 0                       # bytes on disk
        self.written = 0                    # records written to disk (this file)
        self.syncs = 0                      # syncs that wrote (each ends with an fsync)
        self.last_sync: float | None = None
        self.bytes_written = 0              # bytes on disk, every file of this topic (this process)
        self.closed = 0                     # files closed and moved into output_dir
        self.closed_files: deque[Path] = deque(maxlen=100)  # the last final paths (for logs/tests)
        # what failed (op, path): "open" (creating the file), "write", "fsync" (its work file),
        # "move" (the rename into output_dir: the path it was to get); unmoved: the work file left
        self.failure: tuple[str, str] | None = None
        self.unmoved: Path | None = None

    # -- naming -------------------------------------------------------------------------------
    def _datetime(self, now: float) -> str:
        t = time.localtime(now) if self.opts.local_time else time.gmtime(now)
        return time.strftime(self.opts.datetime_format, t)

    def _name(self, now: float, rev: int | None) -> str:
        name = self.raw_name(now, rev)
        if leaves_dir(name):  # checked at start-up and for every topic found; the last guard
            raise OSError(errno.EINVAL, "the file name leaves --output-dir", name)
        return name

    def raw_name(self, now: float, rev: int | None) -> str:
        """The file name from --filename-format, unchecked."""
        o = self.opts
        host = o.host_identifier or short_host()
        host = host.replace("<SHORT_HOST>", short_host()).replace("<HOSTNAME>", socket.gethostname())
        name = (o.filename_format.replace("<TOPIC>", self.topic).replace("<HOST>", host)
                .replace("<PID>", str(os.getpid())).replace("<DATETIME>", self._datetime(now)))
        name = name.replace("<REV>", "" if rev is None else f"-{rev:06d}")
        if o.gzip and not name.endswith(".gz"):
            name += ".gz"
        return name

    def _glob(self) -> str:
        """A glob for every file this topic's name pattern makes, whatever its <DATETIME>,
        <PID> or <REV>."""
        import glob

        o = self.opts
        host = o.host_identifier or short_host()
        host = host.replace("<SHORT_HOST>", short_host()).replace("<HOSTNAME>", socket.gethostname())
        name = o.filename_format.replace("<TOPIC>", self.topic).replace("<HOST>", host)
        parts = re.split(r"<DATETIME>|<PID>|<REV>", name)
        pattern = re.sub(r"\*{2,}", "*", "*".join(glob.escape(part) for part in parts))  # escaped: [*]
        return pattern + ".gz" if o.gzip and not pattern.endswith(".gz") else pattern

    def _trim_newest_earlier(self) -> None:
        """Once, at the first open without a work dir: a crash tore the newest file of this
        topic, whatever <DATETIME> it has (a restart after the hour turned opens another name)."""
        self._scanned = True
        if self._separate_work_dir:
            return  # recovery.recover trimmed the work files at start-up
        try:
            files = [p for p in Path(self.opts.output_dir).glob(self._glob()) if p.is_file()]
        except (OSError, ValueError):
            return
        if files:
            self._trim_torn_tail(max(files, key=lambda p: p.stat().st_mtime))

    def _open(self, now: float) -> None:
        o = self.opts
        if not self._scanned:
            self._trim_newest_earlier()
        base = self._name(now, None)
        if base != self._base:
            self._base, self._rev = base, 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        previous = None  # the newest file an earlier run left under this name (REV below ours)
        while True:
            name = self._name(now, self._rev if o.needs_rev else None)
            path = o.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if o.needs_rev:
                if (Path(o.output_dir) / name).exists():
                    previous = Path(o.output_dir) / name
                    self._rev += 1
                    continue
                try:
                    fd = os.open(path, flags | os.O_EXCL, 0o644)
                except FileExistsError:
                    previous = path
                    self._rev += 1
                    continue
            else:  # no rotation: append to the same file across restarts, like nsq_to_file
                self._trim_torn_tail(path)  # never glue new records onto a torn one
                fd = os.open(path, flags | os.O_APPEND, 0o644)
            break
        if previous is not None and not self._separate_work_dir:
            # without a work dir the file a crash tore is in the output dir: the newest one
            # of this name (with a work dir, recovery.recover already trimmed it at start-up)
            self._trim_torn_tail(previous)
        self._fd, self.path, self.name = fd, path, name
        self.opened_at = now
        self.size = os.fstat(fd).st_size
        self.written = 0
        fsync_dir(path.parent)

    @property
    def _separate_work_dir(self) -> bool:
        o = self.opts
        return bool(o.work_dir) and Path(o.work_dir).resolve() != Path(o.output_dir).resolve()

    def _trim_torn_tail(self, path: Path) -> None:
        """Once per file of an earlier run: cut a torn last record / gzip member (a crash or a
        power loss mid-write) and tell on_trim. Linear: raw files are read from the end."""
        if path in self._checked or path in self.closed_files:
            return
        self._checked.add(path)
        from .recovery import trim_torn_tail  # recovery imports files, not writer: no cycle

        try:
            trimmed = trim_torn_tail(path, self.opts.gzip or path.name.endswith(".gz"))
        except FileNotFoundError:
            return
        if trimmed and self.on_trim is not None:
            self.on_trim(path, trimmed)

    # -- records --------------------------------------------------------------------------------
    def add(self, record: bytes, count: int = 1) -> None:
        """Buffer records: the bytes of one or more, already formatted, each with its separator
        (to-file adds a batch's records at once). Not on disk until sync()."""
        if not record:  # a batch --grep/--where left nothing of: no file is opened for it
            return
        self._records.append(record)
        self._count += count

    @property
    def pending(self) -> int:
        return self._count

    def sync(self) -> int:
        """Write buffered records and fsync. Returns how many records became durable.
        Raises OSError (disk full, ...) with the buffer intact; ``failure`` says where."""
        now = self.clock()
        if self._fd is not None:
            reason = self._must_rotate(now)
            if reason:
                self.close(reason)
        if not self._records:  # files open lazily: an idle topic never gets an empty file
            return 0
        if self._fd is None:
            try:
                self._open(now)
            except OSError as e:
                self.failure = ("open", str(e.filename or self.opts.work))
                raise
        data = b"".join(self._records)
        if self.opts.gzip:
            data = gzip.compress(data, self.opts.gzip_level, mtime=0)  # one complete member
        view = memoryview(data)
        start = self.size
        op = "write"
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            op = "fsync"
            os.fsync(self._fd)
        except OSError:
            self.failure = (op, str(self.path))
            # leave the file as it was before this sync: complete records/members only
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise
        n = self._count
        self._records = []
        self._count = 0
        self.size += len(data)
        self.bytes_written += len(data)
        self.written += n
        self.syncs += 1
        self.last_sync = now
        if self.opts.rotate_size and self.size >= self.opts.rotate_size:
            self.close("size")
        return n

    def _must_rotate(self, now: float) -> str:
        """Why the open file must be closed now ("size", "interval", "datetime"), or ""."""
        o = self.opts
        if o.rotate_size and self.size >= o.rotate_size:
            return "size"
        if o.rotate_interval and now - self.opened_at >= o.rotate_interval:
            return "interval"
        if self._name(now, None) != self._base:
            return "datetime"
        return ""

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def maybe_rotate(self) -> str:
        """Close the current file if its time is up (called on a timer too). The reason if
        closed ("size", "interval", "datetime"), else ""."""
        if self._fd is not None and not self._records:
            reason = self._must_rotate(self.clock())
            if reason:
                self.close(reason)
                return reason
        return ""

    def close(self, reason: str = "stop") -> Path | None:
        """fsync, close, move into output_dir. Buffered records must be synced first.
        ``reason`` (size, interval, datetime, sighup, stop, topic_gone) goes to on_close."""
        if self._fd is None:
            return None
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError:
            self.failure, self.unmoved = ("fsync", str(self.path)), self.path
            os.close(fd)
            raise
        os.close(fd)
        try:
            final = self._move(self.path, self.name)
        except OSError as e:
            dest = getattr(e, "filename2", None) or Path(self.opts.output_dir) / self.name
            self.failure, self.unmoved = ("move", str(dest)), self.path
            raise
        size, records = self.size, self.written
        if final is not None:
            self.closed_files.append(final)
            self.closed += 1
        self._rev += 1
        if final is not None and self.on_close is not None:
            self.on_close(final, reason, size, records)
        return final

    def _move(self, path: Path, name: str) -> Path:
        return move_into(path, Path(self.opts.output_dir), name)
