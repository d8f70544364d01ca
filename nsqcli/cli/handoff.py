"""A long-running command continues in a fresh process image without click.

``nsqcli to-file`` runs for months. Click and what it imports (inspect, ast, typing, datetime,
difflib, uuid ...) would stay in its memory for ever after parsing the command line, a
sizeable part of its resident size (``python -m bench.rss_floor``). So when started as nsqcli (the console
script or ``python -m nsqcli``), the command parses and checks its options as always, puts what
it will run (a JSON spec) into a pipe, and exec()s the very same command line again
(``sys.orig_argv``), with ``NSQCLI_HANDOFF=<the pipe's fd>:<its inode>`` in its environment.
The new image's entry sees the variable before anything else, and runs the spec without
importing click (:func:`resume`).

What stays the same for a user: the pid, the command line (``ps``, ``pgrep -f``) and the process
name (``/proc/PID/comm``: ``pgrep nsqcli``, ``killall -HUP nsqcli``), every open file descriptor
(stdout, stderr, a pipe), the environment, the exit codes and messages (one exit path,
nsqcli.cli.app.run_guarded). SIGINT and SIGTERM are held blocked across the exec and delivered
once the new image has its handlers, so a signal at that moment still ends it with 130/143;
SIGHUP is held until the archive's own handler is in place.

It stays in the first image (same behaviour, more memory) under click's CliRunner (tests,
embedding: :func:`enable` is called only by nsqcli.entry.main), when the program is not a file
that re-runs as nsqcli (``python -``, ``-c``, another program calling the entry), when the spec
does not fit the pipe at once, when the exec fails, and with ``NSQCLI_NO_HANDOFF=1``.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys

from ..errors import NSQError

ENV = "NSQCLI_HANDOFF"
_enabled = False
_entry = None

#: signals held blocked across the exec (a handler of the first image is gone in the second)
_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def enable(entry) -> None:
    """Called by the console script's entry, ``entry`` (nsqcli.entry.main): a command may hand
    off from this process."""
    global _enabled, _entry
    _enabled, _entry = True, entry


def _reruns_nsqcli() -> bool:
    """exec()ing ``sys.orig_argv`` runs nsqcli again, and only nsqcli: the program is a file
    (the console script, or nsqcli/__main__.py under ``-m``) whose ``main`` is the entry's.
    Not ``python -`` or ``python < file`` (stdin is read once), not ``-c CODE``, not a REPL or
    another program calling the entry in-process (its own code would run again)."""
    path = sys.argv[0] if sys.argv else ""
    return (path not in ("", "-", "-c") and os.path.isfile(path)
            and getattr(sys.modules.get("__main__"), "main", None) is _entry)


def hand_off(kind: str, spec: dict) -> None:
    """exec() into a fresh image that runs ``spec`` (see :func:`resume`); returns only when the
    command is to run here instead (not enabled, turned off, not re-runnable, the spec does
    not fit the pipe, or the exec failed)."""
    if not _enabled or os.environ.get("NSQCLI_NO_HANDOFF", "") not in ("", "0") or not _reruns_nsqcli():
        return
    argv, exe = getattr(sys, "orig_argv", None), sys.executable
    if not argv or not exe:
        return
    try:  # the name ps -C, pgrep and killall match (the script's, not the interpreter's): kept
        comm = open("/proc/self/comm", encoding="utf-8", errors="replace").read().rstrip("\n")
    except OSError:
        comm = None
    data = json.dumps({"kind": kind, "comm": comm, "spec": spec}).encode()
    r, w = os.pipe()
    try:
        os.set_blocking(w, False)  # a pipe may hold less than the spec (a user over pipe-user-pages-soft)
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except OSError:  # full (EAGAIN): run here instead
        os.close(r)
        return
    finally:
        os.close(w)
    os.set_inheritable(r, True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:  # the pipe's inode beside its fd: a stray NSQCLI_HANDOFF naming some other pipe is refused
        os.execve(exe, argv, {**os.environ, ENV: f"{r}:{os.fstat(r).st_ino}"})
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(r)


def resume() -> None:
    """In the image :func:`hand_off` exec()ed: read the spec and run it; exits."""
    from .app import App, run_guarded

    fd_text = os.environ.pop(ENV)

    def main() -> int:
        doc = _read(fd_text)
        if doc.get("comm"):
            try:
                with open("/proc/self/comm", "w", encoding="utf-8") as f:
                    f.write(doc["comm"])
            except OSError:
                pass
        spec = doc["spec"]
        if doc.get("kind") == "to-file":
            from .archiving import run

            return run(App(verbosity=spec.get("verbosity", 0)), spec)
        raise ValueError(f"unknown kind {doc.get('kind')!r}")

    run_guarded(main)


def _read(fd_text: str) -> dict:
    """The spec from the pipe :func:`hand_off` left open for us (that very pipe: its inode)."""
    try:
        fd, ino = (int(x) for x in fd_text.split(":"))
        st = os.fstat(fd)
        if fd < 3 or not stat.S_ISFIFO(st.st_mode) or st.st_ino != ino:
            raise OSError("not our pipe")
    except (ValueError, OSError):
        raise NSQError(f"{ENV} is nsqcli's own (a command handing itself off); unset it") from None
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return json.loads(b"".join(chunks))
