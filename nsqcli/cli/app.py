"""The app object (consoles, verbosity) and the one exit path of every command.

Exit codes: 0 ok, 1 runtime error, 2 usage error, 3 deadline passed before the work was done.
Errors become one line on stderr: ``nsqcli: error: <what>``. Tracebacks only with NSQCLI_DEBUG=1
or -vv.
"""

from __future__ import annotations

import os
import sys

import click

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

    def info(self, text: str) -> None:
        if self.verbosity >= 0:
            print(f"nsqcli: {text}", file=sys.stderr, flush=True)

    def warn(self, text: str) -> None:
        if self.verbosity >= 0:
            print(f"nsqcli: warning: {text}", file=sys.stderr, flush=True)

    def debug(self, text: str) -> None:
        if self.verbosity >= 1:
            print(f"nsqcli: {text}", file=sys.stderr, flush=True)


def stop_on_signals(event, signals=None) -> None:
    """SIGINT/SIGTERM set ``event`` for a clean stop; a second one forces the exit (130) when
    the clean stop hangs (an unreachable nsqd, a stuck disk)."""
    import signal

    def handler(signum, frame):
        if event.is_set():
            print("nsqcli: forced exit", file=sys.stderr, flush=True)
            os._exit(130)
        event.set()

    for sig in signals or (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def interrupt_on_signals(signals=None) -> None:
    """The first SIGINT/SIGTERM raises Interrupted in the main thread (the command settles what
    is in flight and reports it); a second one forces the exit (130)."""
    import signal

    state = {"hit": False}

    def handler(signum, frame):
        if state["hit"]:
            print("nsqcli: forced exit", file=sys.stderr, flush=True)
            os._exit(130)
        state["hit"] = True
        raise Interrupted(signum)

    for sig in signals or (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def _debug_wanted() -> bool:
    return os.environ.get("NSQCLI_DEBUG", "") not in ("", "0") or "-vv" in sys.argv[1:3]


def _fail(message: str, code: int) -> None:
    if _debug_wanted():
        import traceback

        traceback.print_exc()
    print(f"nsqcli: error: {message}", file=sys.stderr, flush=True)
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


def run(command: click.Command, args: list[str] | None = None) -> None:
    """Run the click command; map every outcome to an exit code at this one place."""
    try:
        rc = command.main(args=args, prog_name="nsqcli", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:  # one line, naming the problem and where help is
        cmd = e.ctx.command_path if e.ctx else "nsqcli"
        message = " ".join(e.format_message().split())  # one line, even for click's "Choose from:" lists
        print(f"nsqcli: error: {message} (see '{cmd} --help')", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        print(f"nsqcli: error: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        print("nsqcli: aborted", file=sys.stderr)
        sys.exit(130)
    except Interrupted as e:
        import signal

        name = signal.Signals(e.signum).name if e.signum else "signal"
        print(f"nsqcli: interrupted ({name}){': ' + e.message if e.message else ''}", file=sys.stderr, flush=True)
        sys.exit(128 + (e.signum or 2))
    except DeadlineExceeded as e:
        _fail(str(e), EXIT_DEADLINE)
    except NSQError as e:
        _fail(str(e), EXIT_RUNTIME)
    except (BrokenPipeError, StdoutClosed):
        _quiet_broken_pipe()
    except KeyboardInterrupt:
        print("nsqcli: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as e:
        _silence_stdout()  # a failing stdout (ENOSPC) must not fail again at exit
        _fail(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", EXIT_RUNTIME)
    except Exception as e:  # a bug or an unforeseen input: still one line (traceback with -vv)
        _fail(f"internal error: {type(e).__name__}: {e} (NSQCLI_DEBUG=1 shows where)", EXIT_RUNTIME)
    sys.exit(rc if isinstance(rc, int) else EXIT_OK)
