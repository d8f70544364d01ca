"""The one exit path of every nsqcli run, click-free (stdlib and nsqcli.errors only): what
an outcome prints and its exit code. Used by the click app (nsqcli.cli.app.run_guarded, which
adds click's own outcomes in nsqcli.cli.app.run), a handed-off process (nsqcli.cli.handoff),
and `pub`'s fast path (nsqcli.entry), which must not pay for click.

Exit codes: 0 ok, 1 runtime error, 2 usage error, 3 deadline passed before the work was done;
128 + N for signal N. An error is one line on stderr: ``nsqcli: error: <what>``; a traceback
only with NSQCLI_DEBUG=1 or -vv.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from .errors import NSQError

#: the signals that stop a command (130/143/129 when they end it): a terminal's hangup is one,
#: unless the command has a use of its own for it (to-file: close and move the files)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_signals(own_hup: bool = False) -> tuple:
    """:data:`STOP_SIGNALS`, less SIGHUP for a command with a use of its own for it (to-file)."""
    return tuple(sig for sig in STOP_SIGNALS if not (own_hup and sig == signal.SIGHUP))

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_DEADLINE = 0, 1, 2, 3


class DeadlineExceeded(Exception):
    """A --timeout passed before the asked-for work was done (exit 3)."""


class Interrupted(BaseException):
    """SIGINT/SIGTERM during work that must say what it finished (raised in the main thread by
    nsqcli.cli.signals); exit 128 + signal number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum
        self.message = message


class StdoutClosed(Exception):
    """stdout's reader went away (`| head`): a normal end, exit 0. (Not an OSError: click turns
    an EPIPE OSError into a silent exit 1.)"""


class UsageProblem(Exception):
    """A usage error found once the command runs, where no click context is at hand (exit 2,
    the same line as click's usage errors: ``... (see 'nsqcli pub --help')``)."""

    def __init__(self, message: str, command: str = "nsqcli"):
        super().__init__(message)
        self.command = command


_stderr_lock = threading.RLock()  # re-entrant: a signal handler may say a line mid-write


def write_stderr(line: str) -> None:
    """One whole line on stderr, written in one call under one lock: lines from several threads
    never glue together (``print`` writes the text and the newline separately)."""
    data = line if line.endswith("\n") else line + "\n"
    with _stderr_lock:
        try:
            sys.stderr.write(data)
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: nowhere left to say it
            pass


def write_stdout(text: str) -> None:
    """Data on stdout, flushed; a closed pipe ends the command quietly with exit 0."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutClosed() from None


class Voice:
    """The lines a run says to people on stderr: info and warnings unless -q (verbosity < 0),
    debug with -v. (nsqcli.cli.app.App is one, which daemons may point at a logger.)"""

    def __init__(self, verbosity: int = 0):
        self.verbosity = verbosity

    def info(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.verbosity >= 0:
            write_stderr(f"nsqcli: {text}")

    def warn(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.verbosity >= 0:
            write_stderr(f"nsqcli: warning: {text}")

    def debug(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.verbosity >= 1:
            write_stderr(f"nsqcli: {text}")

    def error(self, text: str) -> None:
        write_stderr(f"nsqcli: error: {text}")


def exit_line(text: str, code: int, level: str = "error") -> None:
    """The line that goes with an exit code (``level`` "warning": an interruption, said without
    "error:")."""
    write_stderr(f"nsqcli: error: {text}" if level == "error" else f"nsqcli: {text}")


def debug_wanted() -> bool:
    return os.environ.get("NSQCLI_DEBUG", "") not in ("", "0") or "-vv" in sys.argv[1:3]


def silence_stdout() -> None:
    """Point stdout at /dev/null so that the flush at exit cannot fail ("Exception ignored")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def outcome(main, say=exit_line) -> int:
    """Call ``main()`` and return the exit code of what happened: its own (an int, else 0), or
    the one every run shares for what it raised, said in one line through ``say`` (text, code,
    level). SystemExit passes through."""
    def fail(message: str, code: int) -> int:  # called in the except block: the traceback is at hand
        if debug_wanted():
            import traceback

            traceback.print_exc()
        say(message, code)
        return code

    try:
        rc = main()
    except Interrupted as e:
        import signal

        name = signal.Signals(e.signum).name if e.signum else "signal"
        say(f"interrupted ({name}){': ' + e.message if e.message else ''}", 128 + (e.signum or 2), "warning")
        return 128 + (e.signum or 2)
    except DeadlineExceeded as e:
        return fail(str(e), EXIT_DEADLINE)
    except UsageProblem as e:
        write_stderr(f"nsqcli: error: {e} (see '{e.command} --help')")
        return EXIT_USAGE
    except NSQError as e:
        return fail(str(e), EXIT_RUNTIME)
    except (BrokenPipeError, StdoutClosed):
        silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        write_stderr("nsqcli: interrupted")
        return 130
    except OSError as e:
        silence_stdout()  # a failing stdout (ENOSPC) must not fail again at exit
        return fail(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", EXIT_RUNTIME)
    except Exception as e:  # a bug or an unforeseen input: still one line (traceback with -vv)
        return fail(f"internal error: {type(e).__name__}: {e} (NSQCLI_DEBUG=1 shows where)", EXIT_RUNTIME)
    try:  # output a command wrote but could not deliver (its reader went away) must not fail at exit
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        silence_stdout()
        return EXIT_OK
    return rc if isinstance(rc, int) else EXIT_OK


def calm_teardown() -> None:
    """Let a SIGINT/SIGTERM that lands while the process exits leave the exit code alone.

    The interpreter's teardown puts back the default disposition of every signal that had a
    Python handler, then spends milliseconds unloading modules: a second Ctrl-C (or a SIGTERM
    from a supervisor) in that window killed a command that had already stopped cleanly and said
    so, and its status was "killed by signal" (-2/-15) instead of 130/143. From the first
    ``atexit`` call on (non-daemon threads joined; the commands' own handlers still force an exit
    until then) both are ignored: teardown keeps a disposition of SIG_IGN, and what is left is
    only the exit with the code already decided. `pub`'s fast path skips teardown (exit_now)."""
    global _calm
    if not _calm:  # once per process (in-process test runs call run_guarded many times)
        import atexit

        atexit.register(_ignore_exit_signals)
        _calm = True


_calm = False


def _ignore_exit_signals() -> None:
    for sig in STOP_SIGNALS:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread: nothing to do
            pass


def exit_now(code: int) -> None:
    """Flush and leave without the interpreter's teardown (`pub`'s fast path): teardown restores
    the default signal dispositions first, so a Ctrl-C in those milliseconds killed a pub whose
    message nsqd had taken without a line (and teardown is time a shell loop pays per message)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            silence_stdout()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)
