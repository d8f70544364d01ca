"""One run of ``nsqcli exec``'s COMMAND: the body on its stdin, its stdout and stderr collected,
looked at every ``slice`` seconds (TOUCH, the stop, --command-timeout) until it exits.

The run is over when COMMAND exits, not when its output pipes close: a background process it
started (``sh -c 'worker & echo queued'``) keeps the pipes open, and waiting for it would hold the
message, and a --concurrency slot, for as long as that process lives. What COMMAND wrote is read
until the pipes close or ``linger`` seconds after its exit, whichever is first; then nsqcli closes
its ends (a leftover process writing later gets EPIPE) and leaves it running: it is COMMAND's."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time

CHUNK = 65536


def run_child(argv: list[str], env: dict, body: bytes, tick, *, slice: float = 0.1,
              linger: float = 1.0) -> tuple[int | None, str, bytes, bytes]:
    """(exit code, or None when killed for ``tick``'s reason; what happened; stdout; stderr).
    ``tick(now)`` runs every ``slice``: None, or why to kill the run (its whole process group)."""
    try:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, start_new_session=True)
    except OSError as e:
        return 127, f"cannot run {argv[0]}: {e.strerror or e}", b"", b""
    out, err = [], []
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ, out)
    sel.register(p.stderr, selectors.EVENT_READ, err)
    view, sent = memoryview(body), 0
    if body:
        os.set_blocking(p.stdin.fileno(), False)
        sel.register(p.stdin, selectors.EVENT_WRITE, None)
    else:
        p.stdin.close()
    exited = None
    why = None
    try:
        while sel.get_map() or exited is None:
            if sel.get_map():
                events = sel.select(slice)
            else:  # it closed its pipes and runs on: still TOUCHed, stopped, timed out
                events = []
                try:
                    p.wait(slice)
                except subprocess.TimeoutExpired:
                    pass
            for key, _ in events:
                if key.fileobj is p.stdin:
                    sent = _feed(sel, p.stdin, view, sent)
                else:
                    _read(sel, key)
            now = time.monotonic()
            if exited is None and p.poll() is not None:
                exited = now
            if exited is not None:
                if not sel.get_map() or now - exited >= linger:
                    break  # its leftovers hold the pipes: not waited for
                continue
            why = tick(now)
            if why is not None:
                _kill(p)
                _drain(sel, 2.0)
                break
    finally:
        _close(sel, p)
    out_b, err_b = b"".join(out), b"".join(err)
    if why is not None:
        _reap(p)
        return None, why, out_b, err_b
    code = p.wait()
    return code, _how_it_ended(code), out_b, err_b


def _feed(sel, stdin, view: memoryview, sent: int) -> int:
    """One write of the body to COMMAND's stdin; closed once all of it is written (or COMMAND
    closed its end: it did not read all of it, its choice). Returns how much is written."""
    try:
        sent += os.write(stdin.fileno(), view[sent:sent + CHUNK])
    except BlockingIOError:
        return sent
    except BrokenPipeError:
        sent = len(view)
    if sent >= len(view):
        sel.unregister(stdin)
        stdin.close()
    return sent


def _close(sel, p) -> None:
    """Nothing more is watched or read: nsqcli's ends of the pipes closed."""
    for key in list(sel.get_map().values()):
        sel.unregister(key.fileobj)
    sel.close()
    for f in (p.stdin, p.stdout, p.stderr):
        try:
            f.close()
        except OSError:
            pass


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"killed by {name}"
    return f"exit code {code}"


def _drain(sel, most: float) -> None:
    """After the kill: what is left in the pipes, for at most ``most`` seconds (a process of its
    own that escaped the group can keep them open)."""
    end = time.monotonic() + most
    while sel.get_map() and time.monotonic() < end:
        for key, _ in sel.select(max(0.0, end - time.monotonic())):
            if key.data is None:  # stdin
                sel.unregister(key.fileobj)
                continue
            _read(sel, key)


def _read(sel, key) -> None:
    """One read of stdout or stderr into its list; at its end, no longer watched."""
    data = os.read(key.fileobj.fileno(), CHUNK)
    if data:
        key.data.append(data)
    else:
        sel.unregister(key.fileobj)


def _reap(p) -> int | None:
    try:
        return p.wait(2.0)
    except subprocess.TimeoutExpired:
        return None


def _kill(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            p.kill()
        except OSError:
            pass
