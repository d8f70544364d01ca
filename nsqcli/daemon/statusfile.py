"""``--status-file PATH``: the run's snapshot as JSON, replaced atomically each interval, for
hosts without a scraper (``jq .health < PATH``, a monitoring agent's file check).

:meth:`StatusFile.write` writes a temporary file in the same directory, fsyncs it and renames it
over PATH (``os.replace``): a reader sees the previous whole file or the new whole file, never a
part. The directory is not created: :meth:`StatusFile.check` refuses, at start-up, a path whose
directory is missing or not writable, or that is a directory.
"""

from __future__ import annotations

import json
import os
import stat
import threading


class StatusFile:
    """Where the status goes: ``StatusFile(path).write(snapshot)``."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        folder, name = os.path.split(os.path.abspath(self.path))
        # one temporary name per process (and a lock per StatusFile): no other writer shares it
        self._tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        self._lock = threading.Lock()
        self.writes = 0

    @staticmethod
    def check(path: str) -> None:
        """Raise ValueError (one line naming the path) unless a status file can be written at
        ``path``: its directory exists and takes a new file (tried: a file created and removed),
        and ``path`` is not a directory, nor a device or a pipe (``/dev/stdout``: each write replaces
        the path by a new file, which would replace the device's name)."""
        path = os.fspath(path)
        if not path:
            raise ValueError("status file: the path is empty")
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise ValueError(f"status file {path} is a directory: give a file name in it (e.g. {os.path.join(path, 'status.json')})")
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = None  # not there yet (or a dangling link): a new file is made
        if mode is not None and not stat.S_ISREG(mode):
            raise ValueError(f"status file {path} is not a regular file (a device, a pipe or a socket): it is "
                             "replaced by a new file at each write; give a file path")
        if not os.path.exists(folder):
            raise ValueError(f"status file {path}: directory {folder} does not exist (create it first)")
        if not os.path.isdir(folder):
            raise ValueError(f"status file {path}: {folder} is not a directory")
        probe = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.check")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise ValueError(f"status file {path}: cannot create a file in {folder}: {e.strerror or e}") from None

    def write(self, snapshot: dict) -> None:
        """Replace the file with ``snapshot`` as JSON (atomically). Raises OSError naming the
        path when it cannot (the temporary file is removed)."""
        data = (json.dumps(snapshot, indent=1, default=str) + "\n").encode()
        with self._lock:
            fd = -1
            try:
                fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
                os.close(fd)
                fd = -1
                os.replace(self._tmp, self.path)
            except OSError as e:
                if fd >= 0:
                    os.close(fd)
                try:
                    os.unlink(self._tmp)
                except OSError:
                    pass
                err = OSError(f"cannot write the status file {self.path}: {e.strerror or e}")
                err.errno = e.errno  # (not .filename: str(err) would become "[Errno N] None: PATH")
                raise err from None
            self.writes += 1

    def __repr__(self) -> str:
        return f"<StatusFile {self.path}>"
