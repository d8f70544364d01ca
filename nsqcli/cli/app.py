"""The app object (consoles, verbosity) and the exit path of every command: click's own
outcomes (:func:`run`), then the ones every run shares (:func:`run_guarded`, which is
nsqcli.exits.outcome: click-free, shared with `pub`'s fast path).

Exit codes: 0 ok, 1 runtime error, 2 usage error, 3 deadline passed before the work was done.
Errors become one line on stderr: ``nsqcli: error: <what>``. Tracebacks only with NSQCLI_DEBUG=1
or -vv.
"""

from __future__ import annotations

import os
import sys
import threading

from ..daemon.outages import STABLE_AFTER, Outages, source_error, sources_recovered  # noqa: F401 - re-exported

# the exit path itself is click-free in nsqcli.exits (pub's fast path shares it); its names are
# re-exported here, where the commands have always found them
from ..exits import (EXIT_DEADLINE, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, DeadlineExceeded,  # noqa: F401
                     Interrupted, StdoutClosed, UsageProblem, Voice, _stderr_lock, calm_teardown, exit_line, outcome,
                     silence_stdout, write_stderr, write_stdout)


class App(Voice):
    """Shared state of one nsqcli run: verbosity and the stderr console for people."""

    def __init__(self, verbosity: int = 0):
        super().__init__(verbosity)
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
        if self.logger is None:
            super().info(text)
        elif self.verbosity >= 0:
            self.logger.info(text, extra=_extra(event, fields))

    def warn(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.logger is None:
            super().warn(text)
        elif self.verbosity >= 0:
            self.logger.warning(text, extra=_extra(event, fields))

    def debug(self, text: str, event: str | None = None, fields: dict | None = None) -> None:
        if self.logger is None:
            super().debug(text)
        else:  # the log level decides (--log-level debug)
            self.logger.debug(text, extra=_extra(event, fields))


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


def forced_exit(signum: int, lines: list[str] | None = None) -> None:
    """A second signal: ``lines`` (without "nsqcli: "; the last one follows "forced exit
    (SIG...): "), then exit 128 + its number (130 SIGINT, 143 SIGTERM, 129 SIGHUP, as README says).
    os.write, not sys.stderr: the handler may run inside the main thread's own write to it (a
    reentrant write raises, and the exit would not happen)."""
    import signal

    lines = list(lines or [])
    last = lines.pop() if lines else ""
    text = "".join(f"nsqcli: {line}\n" for line in lines)
    text += f"nsqcli: forced exit ({signal.Signals(signum).name}){': ' + last if last else ''}\n"
    try:
        os.write(2, text.encode())
    except OSError:
        pass
    os._exit(128 + signum)


def stop_on_signals(event, signals=None) -> None:
    """SIGINT/SIGTERM/SIGHUP set ``event`` for a clean stop; a second one forces the exit (128 + its number) when
    the clean stop hangs (an unreachable nsqd, a stuck disk)."""
    import signal

    from .setter import SETTER

    SETTER.start()
    hit: list = []

    def handler(signum, frame):
        if hit or event.is_set():
            forced_exit(signum)
        hit.append(signum)
        SETTER.post(event)  # not event.set(): the main thread may be inside event.wait() (nsqcli.cli.setter)

    from ..exits import STOP_SIGNALS

    for sig in signals or STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored by the parent: stays ignored
            signal.signal(sig, handler)


#: the daemons' logger with --log-format json (set by the run harness): the line that goes with
#: the exit code is then a JSON record too ({"level": "error", "event": "exit", "exit_code": N})
json_exit_log = None


def _exit_line(text: str, code: int, level: str = "error") -> None:
    log = json_exit_log
    if log is not None:
        getattr(log, level)(text, extra={"event": "exit", "fields": {"exit_code": code}})
    else:
        exit_line(text, code, level)


def _quiet_broken_pipe() -> None:
    # stdout's reader went away (`| head`): exit 0 without "Exception ignored" noise.
    silence_stdout()
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
    mapped by :func:`run`) become one line and their exit code (nsqcli.exits.outcome, which
    `pub`'s fast path shares). Click-free: a handed-off process (nsqcli.cli.handoff) exits
    through here too. A signal landing once the process exits no longer kills it
    (nsqcli.exits.calm_teardown)."""
    calm_teardown()  # registered first: also when main() leaves by SystemExit (click's usage errors)
    sys.exit(outcome(main, _exit_line))
