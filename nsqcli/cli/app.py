"""The app object (consoles, verbosity) and the one exit path of every command.

Exit codes: 0 ok, 1 runtime error, 2 usage error, 3 deadline passed before the work was done.
Errors become one line on stderr: ``nsqcli: error: <what>``. Tracebacks only with NSQCLI_DEBUG=1
or -vv.
"""

from __future__ import annotations

import os
import sys
import threading

from ..daemon.outages import STABLE_AFTER, Outages, source_error, sources_recovered  # noqa: F401 - re-exported
from ..errors import NSQError

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_DEADLINE = 0, 1, 2, 3


class DeadlineExceeded(Exception):
    """A --timeout passed before the asked-for work was done (exit 3)."""


class Interrupted(BaseException):
    """SIGINT/SIGTERM during work that must say what it finished (raised in the main thread by
    :func:`interrupt_on_signals`); exit 128 + signal number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum
        self.message = message


class StdoutClosed(Exception):
    """stdout's reader went away (`| head`): a normal end, exit 0. (Not an OSError: click turns
    an EPIPE OSError into a silent exit 1.)"""


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


class App:
    """Shared state of one nsqcli run: verbosity and the stderr console for people."""

    def __init__(self, verbosity: int = 0):
        self.verbosity = verbosity
        # a logging.Logger (nsqcli.daemon.logs.setup): when set (the run harness sets it for the
        # daemons), info/warn/debug are log records (timestamp, pid, --log-format json) instead
        # of "nsqcli: ..." lines
        self.logger = None
        self.context: str | None = None  # `nsqcli --context NAME`, then the one a command used
        self._console = None

    @property
    def console(self):
        """A rich console on stderr (colour only on a TTY); created on first use."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False, emoji=False, markup=False)
        return self._console

    @property
    def stderr_is_tty(self) -> bool:
        return sys.stderr.isatty()

    def info(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.verbosity >= 0:
            if self.logger is not None:
                self.logger.info(text, extra=_extra(event, fields))
            else:
                write_stderr(f"nsqcli: {text}")

    def warn(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.verbosity >= 0:
            if self.logger is not None:
                self.logger.warning(text, extra=_extra(event, fields))
            else:
                write_stderr(f"nsqcli: warning: {text}")

    def debug(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.logger is not None:  # the log level decides (--log-level debug)
            self.logger.debug(text, extra=_extra(event, fields))
        elif self.verbosity >= 1:
            write_stderr(f"nsqcli: {text}")

    def error(self, text: str) -> None:
        write_stderr(f"nsqcli: error: {text}")


def _extra(event: str | None, fields: dict | None) -> dict:
    return {"event": event or "log", "fields": fields or {}}


def once_each(say):
    """``say`` wrapped to say each sentence once per run, however many threads and connections
    repeat it (a Config.on_notice)."""
    said: set[str] = set()
    lock = threading.Lock()

    def notice(text: str) -> None:
        with lock:
            if text in said:
                return
            said.add(text)
        say(text)

    return notice


def stop_on_signals(event, signals=None) -> None:
    """SIGINT/SIGTERM set ``event`` for a clean stop; a second one forces the exit (130) when
    the clean stop hangs (an unreachable nsqd, a stuck disk)."""
    import signal

    def handler(signum, frame):
        if event.is_set():
            write_stderr("nsqcli: forced exit")
            os._exit(130)
        event.set()

    for sig in signals or (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored by the parent: stays ignored
            signal.signal(sig, handler)


def interrupt_on_signals(signals=None) -> None:
    """The first SIGINT/SIGTERM raises Interrupted in the main thread (the command settles what
    is in flight and reports it); a second one forces the exit (130)."""
    import signal

    state = {"hit": False}

    def handler(signum, frame):
        if state["hit"]:
            write_stderr("nsqcli: forced exit")
            os._exit(130)
        state["hit"] = True
        raise Interrupted(signum)

    for sig in signals or (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored by the parent: stays ignored
            signal.signal(sig, handler)


def _debug_wanted() -> bool:
    return os.environ.get("NSQCLI_DEBUG", "") not in ("", "0") or "-vv" in sys.argv[1:3]


#: the daemons' logger with --log-format json (set by the run harness): the line that goes with
#: the exit code is then a JSON record too ({"level": "error", "event": "exit", "exit_code": N})
json_exit_log = None


def _exit_line(text: str, code: int, level: str = "error") -> None:
    log = json_exit_log
    if log is not None:
        getattr(log, level)(text, extra={"event": "exit", "fields": {"exit_code": code}})
    else:
        write_stderr(f"nsqcli: error: {text}" if level == "error" else f"nsqcli: {text}")


def _fail(message: str, code: int) -> None:
    if _debug_wanted():
        import traceback

        traceback.print_exc()
    _exit_line(message, code)
    sys.exit(code)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the flush at exit cannot fail ("Exception ignored")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _quiet_broken_pipe() -> None:
    # stdout's reader went away (`| head`): exit 0 without "Exception ignored" noise.
    _silence_stdout()
    sys.exit(EXIT_OK)


def run(command, args: list[str] | None = None) -> None:
    """Run the click command; map every outcome to an exit code at this one place."""
    import click

    from ..stdio import repair_closed_streams

    repair_closed_streams()

    def main():
        try:
            return command.main(args=args, prog_name="nsqcli", standalone_mode=False)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except SystemExit as e:
            if e.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
                _quiet_broken_pipe()  # click's own output (--help, -V) met a closed stdout: its exit 1 is ours 0
            raise
        except click.exceptions.NoArgsIsHelpError as e:  # `nsqcli topic`: its help, as bare `nsqcli` does
            try:
                write_stdout(e.ctx.get_help() + "\n")
            except (BrokenPipeError, StdoutClosed):
                _quiet_broken_pipe()
            return EXIT_OK
        except click.UsageError as e:  # one line, naming the problem and where help is
            cmd = e.ctx.command_path if e.ctx else "nsqcli"
            message = " ".join(e.format_message().split())  # one line, even for click's "Choose from:" lists
            write_stderr(f"nsqcli: error: {message} (see '{cmd} --help')")
            sys.exit(EXIT_USAGE)
        except click.ClickException as e:
            write_stderr(f"nsqcli: error: {e.format_message()}")
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            write_stderr("nsqcli: aborted")
            sys.exit(130)

    run_guarded(main)


def run_guarded(main) -> None:
    """Call ``main()`` and exit with its code; the outcomes every run shares (click's own are
    mapped by :func:`run`) become one line and their exit code. Click-free: a handed-off
    process (nsqcli.cli.handoff) exits through here too."""
    try:
        rc = main()
    except Interrupted as e:
        import signal

        name = signal.Signals(e.signum).name if e.signum else "signal"
        _exit_line(f"interrupted ({name}){': ' + e.message if e.message else ''}", 128 + (e.signum or 2), "warning")
        sys.exit(128 + (e.signum or 2))
    except DeadlineExceeded as e:
        _fail(str(e), EXIT_DEADLINE)
    except NSQError as e:
        _fail(str(e), EXIT_RUNTIME)
    except (BrokenPipeError, StdoutClosed):
        _quiet_broken_pipe()
    except KeyboardInterrupt:
        write_stderr("nsqcli: interrupted")
        sys.exit(130)
    except OSError as e:
        _silence_stdout()  # a failing stdout (ENOSPC) must not fail again at exit
        _fail(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", EXIT_RUNTIME)
    except Exception as e:  # a bug or an unforeseen input: still one line (traceback with -vv)
        _fail(f"internal error: {type(e).__name__}: {e} (NSQCLI_DEBUG=1 shows where)", EXIT_RUNTIME)
    try:  # output a command wrote but could not deliver (its reader went away) must not fail at exit
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _quiet_broken_pipe()
    sys.exit(rc if isinstance(rc, int) else EXIT_OK)
