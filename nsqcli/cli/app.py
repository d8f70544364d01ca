"""The app object (consoles, verbosity) and the one exit path of every command.

Exit codes: 0 ok, 1 runtime error, 2 usage error, 3 deadline passed before the work was done.
Errors become one line on stderr: ``nsqcli: error: <what>``. Tracebacks only with NSQCLI_DEBUG=1
or -vv.
"""

from __future__ import annotations

import os
import sys
import threading
import time

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
            write_stderr(f"nsqcli: {text}")

    def warn(self, text: str) -> None:
        if self.verbosity >= 0:
            write_stderr(f"nsqcli: warning: {text}")

    def debug(self, text: str) -> None:
        if self.verbosity >= 1:
            write_stderr(f"nsqcli: {text}")

    def error(self, text: str) -> None:
        write_stderr(f"nsqcli: error: {text}")


class Outages:
    """Repeated warnings for failures that last (a dead destination, an nsqd refusing every
    reconnect), one state per ``key``:

    - the first failure is said at once (``warning: TEXT``);
    - repeats of the same text while it lasts are counted, and said again with the count
      (``TEXT (x9 since 12:00:01)``) at most every ``every`` seconds, or at once when the text
      changes;
    - the next success says one ``recovered`` line; a later outage is said again.

    Thread-safe; the clock is injectable for tests."""

    def __init__(self, app: "App", every: float = 30.0, clock=time.monotonic, wall=time.time):
        self.app, self.every, self.clock, self.wall = app, every, clock, wall
        self._lock = threading.Lock()
        self._open: dict = {}  # key -> [text, count, first wall time, last said (clock)]

    def failed(self, key, text: str) -> None:
        """One more failure of ``key``; says it when new, changed, or due."""
        now = self.clock()
        with self._lock:
            state = self._open.get(key)
            if state is None:
                self._open[key] = [text, 1, self.wall(), now]
                line = text
            else:
                state[1] += 1
                if text == state[0] and now - state[3] < self.every:
                    return
                state[0], state[3] = text, now
                line = f"{text} (x{state[1]} since {self._hms(state[2])})"
        self.app.warn(line)

    def ok(self, key, what: str | None = None) -> None:
        """``key`` works again: one ``recovered`` line if it was failing, else nothing."""
        if key not in self._open:  # the common case, without the lock
            return
        with self._lock:
            state = self._open.pop(key, None)
        if state is not None:
            n = state[1]
            self.app.info(f"recovered: {what or key} ({n} failure{'s' if n != 1 else ''} since "
                          f"{self._hms(state[2])})")

    def say_still_failing(self) -> None:
        """At the end of a run: each outage that has not recovered, with its count."""
        with self._lock:
            still = list(self._open.values())
        for text, n, since, _ in still:
            if n > 1:
                self.app.warn(f"{text} (x{n} since {self._hms(since)}, not recovered)")

    def failing(self) -> list:
        with self._lock:
            return list(self._open)

    @staticmethod
    def _hms(t: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(t))


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


def source_error(outages: Outages, err) -> None:
    """A consumer's error (its nsqd lost or refusing, a lookupd failing): said when it starts,
    counted while it lasts; :func:`sources_recovered` says when the nsqd is back."""
    outages.failed(("source", getattr(err, "address", None) or getattr(err, "endpoint", None)), f"source: {err}")


#: seconds a connection must have lasted before its source counts as recovered
STABLE_AFTER = 1.0


def sources_recovered(outages: Outages, consumers) -> None:
    """Called periodically: a source that failed and whose nsqd is connected again (or, for an
    error without an address, any connection) recovered."""
    failing = [k for k in outages.failing() if isinstance(k, tuple) and k[0] == "source"]
    if not failing:
        return
    # connected for a while: a server that fails every connection right after its handshake
    # (garbage after SUB's OK) stays one counted outage, not "recovered" after each reconnect
    now = time.time()
    connected = {s.address for c in consumers for s in c.stats()
                 if s.connected_at is not None and now - s.connected_at >= STABLE_AFTER}
    for key in failing:
        if key[1] in connected or (connected and not _is_nsqd(key[1], consumers)):
            outages.ok(key, f"source {key[1]}" if key[1] else "source")


def _is_nsqd(address, consumers) -> bool:
    """An explicitly given nsqd (recovers only when connected again); other addresses (lookupd,
    an nsqd found through lookupd that is gone) recover once anything is connected."""
    return address is not None and any(address in c.nsqd_addresses for c in consumers)


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


def _fail(message: str, code: int) -> None:
    if _debug_wanted():
        import traceback

        traceback.print_exc()
    write_stderr(f"nsqcli: error: {message}")
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
        write_stderr(f"nsqcli: interrupted ({name}){': ' + e.message if e.message else ''}")
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
