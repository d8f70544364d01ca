"""Run nsqcli in this process: the console script's entry (nsqcli.entry.main: early signals, the
`pub` fast path, else the click app and its one exit path) with an argv, an environment and
stdin, returning what the real executable would give - exit code, stdout bytes, stderr bytes -
in milliseconds instead of an interpreter start and the imports (~0.3 s each on a busy machine).

For the usage-error rows (exit 2, one line, nothing started). tests/cli/test_app.py proves, one
argv per kind (usage error, runtime error, deadline), that the real executable gives the same
three things for the same argv.

Everything a run may change in the process is put back after it: os.environ (a context may set
variables; the run sees clean_env() as a child would), sys.argv, the standard streams, every
signal handler and the signal mask, a real-time interval timer it left armed, the logging
configuration, nsqcli.clock.STARTED (--timeout counts from the run's start, as from a process
start), nsqcli.cli.app.json_exit_log and nsqcli.cli.handoff's entry. The fast path's exit
(nsqcli.exits.exit_now: os._exit, no teardown) becomes a SystemExit with the same code. A run
that leaves a thread running fails (a usage error starts nothing), unless ``may_stay`` says it
is a library's own (tests/spark/test_spark_commands.py: a Spark command's runs share one JVM).
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tests.support.helpers import clean_env


def _signals() -> dict:
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handlers[sig] = signal.getsignal(sig)
        except (ValueError, OSError):
            pass
    return handlers


def _restore_signals(saved: dict) -> None:
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


def _logging() -> tuple:
    loggers = [logging.root] + [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    return (logging.root.manager.disable,
            [(lg, list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers])


def _restore_logging(saved: tuple) -> None:
    disable, loggers = saved
    logging.disable(disable)
    known = {id(lg) for lg, *_ in loggers}
    for lg, handlers, level, propagate, disabled in loggers:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled
    for lg in list(logging.root.manager.loggerDict.values()):  # a logger the run made: no handler stays
        if isinstance(lg, logging.Logger) and id(lg) not in known:
            lg.handlers.clear()


def _fast_path_exit(code: int) -> None:
    """nsqcli.exits.exit_now, but for os._exit: flush, then leave as sys.exit does."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    raise SystemExit(code)


def _read(f) -> bytes:
    f.flush()
    f.buffer.seek(0)
    return f.buffer.read()


def run_in_process(args, env: dict | None = None, input: bytes = b"",
                   may_stay=lambda thread: False) -> subprocess.CompletedProcess:
    """nsqcli ``args`` run in this process with stdin ``input`` and the environment
    ``clean_env(env)`` (what helpers.run_nsqcli gives the real executable). ``may_stay``: the
    threads a run may leave (a library's own, e.g. py4j's once a JVM runs)."""
    import nsqcli.cli.app as app
    import nsqcli.cli.handoff as handoff
    import nsqcli.clock as clock
    import nsqcli.exits as exits
    from nsqcli.entry import main

    assert threading.current_thread() is threading.main_thread(), "signal handlers need the main thread"
    saved_env, saved_argv = dict(os.environ), sys.argv
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_signals, saved_mask = _signals(), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    timer_armed = signal.getitimer(signal.ITIMER_REAL)[0] > 0
    saved_logging = _logging()
    saved_state = (clock.STARTED, app.json_exit_log, handoff._enabled, handoff._entry, exits.exit_now)
    threads = set(threading.enumerate())
    child_env = clean_env(env)
    stdin_file = tempfile.TemporaryFile()
    stdin_file.write(input)
    stdin_file.seek(0)
    # what the real executable has under a UTF-8 locale: strict-ish text over byte streams
    sys.stdin = io.TextIOWrapper(stdin_file, encoding="utf-8", errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(tempfile.TemporaryFile(), encoding="utf-8", errors="surrogateescape",
                                  write_through=False)
    sys.stderr = io.TextIOWrapper(tempfile.TemporaryFile(), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    out_stream, err_stream = sys.stdout, sys.stderr
    os.environ.clear()
    os.environ.update(child_env)
    sys.argv = ["nsqcli", *args]
    clock.STARTED = time.monotonic()
    exits.exit_now = _fast_path_exit
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        try:
            out, err = _read(out_stream), _read(err_stream)
        finally:
            for f in (sys.stdin, out_stream, err_stream):
                f.close()
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            sys.argv = saved_argv
            os.environ.clear()
            os.environ.update(saved_env)
            _restore_signals(saved_signals)
            signal.pthread_sigmask(signal.SIG_SETMASK, saved_mask)
            if not timer_armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
            _restore_logging(saved_logging)
            clock.STARTED, app.json_exit_log, handoff._enabled, handoff._entry, exits.exit_now = saved_state
    # (nsqcli.cli.signals's setter thread, like the real executable's, lives as long as the process)
    left = [t for t in threading.enumerate() if t not in threads and t.is_alive() and not may_stay(t)
            and t.name != "nsqcli-signals"]
    for t in left:
        t.join(1)
    assert not [t for t in left if t.is_alive()], f"nsqcli {args} left threads running: {left}"
    return subprocess.CompletedProcess(["nsqcli", *args], code, out, err)
