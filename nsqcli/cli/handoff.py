"""A long-running command continues in a fresh process image without click.

``nsqcli to-file`` runs for months. Click and what it imports (inspect, ast, typing, datetime,
difflib, uuid ...) stay in its memory for ever after parsing the command line: measured, ~4 of
its ~21 MB peak RSS (``python -m bench.rss_floor``). So when started from the console script
(nsqcli.entry), the command parses and checks its options as always, puts what it will run (a
JSON spec) into a pipe, and exec()s the very same command line again (``sys.orig_argv``), with
``NSQCLI_HANDOFF=<the pipe's fd>`` in its environment. The new image's entry sees the variable
before anything else, and runs the spec without importing click (:func:`resume`).

What stays the same for a user: the pid (a supervisor, ``kill -HUP $(pgrep ...)``), the command
line ``ps`` shows, every open file descriptor (stdout, stderr, a pipe), the environment, the
exit codes and messages (one exit path, nsqcli.cli.app.run_guarded). SIGINT and SIGTERM are held
blocked across the exec and delivered once the new image has its handlers, so a signal at that
moment still ends it with 130/143; SIGHUP is held until the archive's own handler is in place.

Under click's CliRunner (tests, embedding) nothing is handed off; :func:`enable` is called only
by nsqcli.entry.main. ``NSQCLI_NO_HANDOFF=1`` keeps a command in the first process (a spec that
cannot be handed off, or an exec that fails, does too).
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

#: signals held blocked across the exec (a handler of the first image is gone in the second)
_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def enable() -> None:
    """Called by the console script's entry: a command may hand off from this process."""
    global _enabled
    _enabled = True


def hand_off(kind: str, spec: dict) -> None:
    """exec() into a fresh image that runs ``spec`` (see :func:`resume`); returns only when the
    command is to run here instead (not enabled, turned off, or the exec failed)."""
    if not _enabled or os.environ.get("NSQCLI_NO_HANDOFF", "") not in ("", "0"):
        return
    argv, exe = getattr(sys, "orig_argv", None), sys.executable
    data = json.dumps({"kind": kind, "spec": spec}).encode()
    if not argv or not exe or len(data) > 60_000:  # a pipe holds 64 KiB without a reader
        return
    r, w = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    finally:
        os.close(w)
    os.set_inheritable(r, True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        os.execve(exe, argv, {**os.environ, ENV: str(r)})
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(r)


def resume() -> None:
    """In the image :func:`hand_off` exec()ed: read the spec and run it; exits."""
    from .app import App, run_guarded

    fd_text = os.environ.pop(ENV)

    def main() -> int:
        doc = _read(fd_text)
        spec = doc["spec"]
        if doc.get("kind") == "to-file":
            from .archiving import run

            return run(App(verbosity=spec.get("verbosity", 0)), spec)
        raise ValueError(f"unknown kind {doc.get('kind')!r}")

    run_guarded(main)


def _read(fd_text: str) -> dict:
    """The spec from the pipe :func:`hand_off` left open for us."""
    try:
        fd = int(fd_text)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError("not a pipe")
    except (ValueError, OSError):
        raise NSQError(f"{ENV} is nsqcli's own (a command handing itself off); unset it") from None
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return json.loads(b"".join(chunks))
