"""``nsqcli exec``: a shell consumer. COMMAND runs once per message (the body on its stdin, the
message's topic, channel, id, attempts and timestamp in its environment); FIN on exit 0, REQ
with backoff otherwise; TOUCH while it runs; dead letters after --max-attempts. The run
(signals, -n, --timeout, --idle-timeout, metrics) is the harness's (nsqcli.cli.harness)."""

from __future__ import annotations

import os
import sys
import threading
import time

import click

from ..command import command, option
from ..dead_letters import check_dead_letter, dead_letter_options, open_dead_letters
from ..harness import Job
from ..options import (build_config, connection_options, daemon_options, nsqd_addresses, pop_connection, pop_run,
                       topic_arguments)
from ..types import DURATION

#: SIGTERM/SIGINT: how long the stop waits for the commands running (then kills them: REQ)
STOP_WAIT = 30.0
#: how often a running command is looked at (its end, the stop, --command-timeout, TOUCH)
SLICE = 0.1


@command("exec", examples="""
nsqcli exec orders -c billing -- ./bill.sh                  # body on stdin, NSQ_* in the environment
nsqcli exec orders -c billing --concurrency 8 --command-timeout 30s -- python3 handle.py
nsqcli exec orders -c billing --max-attempts 5 --dead-letter-topic orders_dead -- sh -c 'jq -e .id >/dev/null'
nsqcli exec orders -c billing --give-up-exit-code 65 -- ./bill.sh   # exit 65: FIN (or dead letter), no retry
""")
@topic_arguments(channel="option", channel_required=True, rest="command", rest_metavar="-- COMMAND [ARG]...",
                 rest_min=1, topic_help="Topic to consume (or the first argument).",
                 channel_help="Channel (required: exec takes the messages it is given).")
@option("--concurrency", type=click.IntRange(1, 1000), default=1, show_default=True,
        help="Commands running at once (1: one message at a time, in the order received).")
@option("--command-timeout", type=DURATION, default=None,
        help="Kill a run's process group after this long (SIGKILL): the message is requeued.")
@option("--give-up-exit-code", "give_up_codes", type=click.IntRange(1, 255), multiple=True, metavar="CODE",
        help="This exit code means 'never retry': the message is FINed (dead-lettered with --dead-letter-topic), "
             "said (repeatable).")
@option("--requeue-delay", type=DURATION, default="90s", show_default=True,
        help="A failed message comes back after this x its attempts (capped at 15m).")
@option("--max-attempts", type=click.IntRange(0), default=0, show_default=True,
        help="After this many failed attempts: dead-letter the message (--dead-letter-topic) or else FIN it, "
             "said (0 = retry for ever).")
@dead_letter_options
@daemon_options(count_help="Stop after N messages done (FINed: succeeded, given up or dead-lettered; 0 = no limit).",
                live_help="Live table of the connections on stderr (default: off - COMMAND writes to the terminal "
                          "too; status lines instead).")
@connection_options(consumer=True)
@click.pass_obj
def exec_command(app, topic, channel, rest, concurrency, command_timeout, give_up_codes, requeue_delay, max_attempts,
                 dead_letter_topic, count, **kwargs):
    """Run COMMAND once per message of TOPIC/CHANNEL (a consumer written in shell).

    \b
    The body is COMMAND's stdin; its environment has NSQ_TOPIC, NSQ_CHANNEL, NSQ_MESSAGE_ID,
    NSQ_ATTEMPTS (1 the first time) and NSQ_TIMESTAMP (nanoseconds since the epoch).

    Exit 0: the message is FINed. Any other exit (or a signal, or --command-timeout): REQ after
    --requeue-delay x its attempts, and the consumer backs off. nsqd's message timeout is kept
    from expiring while the command runs (TOUCH every half of it). COMMAND's stdout goes to
    nsqcli's stdout, each run's output in one piece (never interleaved with another run's);
    its stderr to stderr, also in one piece when the run ends. Each run is its own process
    group. A run ends when COMMAND exits: a background process it leaves (worker &) is not
    waited for, and what it writes more than 1 s after COMMAND's exit is not collected. --max-attempts N: after the Nth failed attempt the message is dead-lettered
    (--dead-letter-topic; FINed after that topic's nsqd said OK; the envelope's error carries
    the last line COMMAND wrote to stderr) or else FINed, said. At least once: killed at any moment (even kill -9),
    what was not FINed is redelivered. SIGTERM/SIGINT/SIGHUP: no new runs, the running ones
    may finish (30 s at most, then killed and requeued), then exit 0.
    """
    settings = pop_run(kwargs)
    conn = pop_connection(kwargs)
    argv = list(rest)
    if "--" not in sys.argv[1:]:  # `exec T -c C sh -c 'x'`: the script's -c would be read as nsqcli's --channel
        raise click.UsageError(f"put -- before COMMAND (nsqcli exec TOPIC -c CHANNEL -- {' '.join(argv)} ...): "
                               "without it COMMAND's own options are read as nsqcli's")
    check_dead_letter(max_attempts, dead_letter_topic, [topic])
    if command_timeout is not None and command_timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--command-timeout'")
    import shutil

    if "/" not in argv[0] and shutil.which(argv[0]) is None:
        raise click.UsageError(f"command not found: {argv[0]!r} (not in PATH)")
    if "/" in argv[0] and not os.access(argv[0], os.X_OK):
        raise click.UsageError(f"{argv[0]!r} is not an executable file")
    if settings.live and sys.stdout.isatty() and _same_terminal():
        raise click.UsageError("--live draws on the terminal that also gets COMMAND's output: redirect stdout "
                               "or leave out --live")
    if settings.live is None:  # COMMAND's stdout and stderr would tear the table: status lines unless asked
        settings.live = False
    cfg = build_config(conn, max_in_flight=concurrency, concurrency=concurrency, max_attempts=0,
                       default_requeue_delay=requeue_delay, backoff_multiplier=min(1.0, max(0.01, requeue_delay)))
    job = Exec(app, topic, channel, conn, cfg, argv, command_timeout, set(give_up_codes), requeue_delay,
               max_attempts, dead_letter_topic, count)
    from ..harness import run

    return run(app, job, settings)


def _same_terminal() -> bool:
    try:
        a, b = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return (a.st_dev, a.st_ino, a.st_rdev) == (b.st_dev, b.st_ino, b.st_rdev)


def _last_line(err: bytes, most: int = 200) -> str:
    for line in reversed(err.decode("utf-8", "replace").splitlines()):
        if line.strip():
            line = line.strip()
            return line if len(line) <= most else line[:most] + "..."
    return ""


class Exec(Job):
    name = "exec"

    def __init__(self, app, topic, channel, conn, cfg, argv, command_timeout, give_up_codes, requeue_delay,
                 max_attempts, dead_letter_topic, count):
        super().__init__()
        from ...client.consumer import Consumer
        from ..app import Outages, source_error

        self.app, self.topic, self.channel, self.conn = app, topic, channel, conn
        self.argv, self.command_timeout, self.give_up_codes = argv, command_timeout, give_up_codes
        self.requeue_delay, self.max_attempts, self.dead_letter_topic = requeue_delay, max_attempts, dead_letter_topic
        self.count = count
        self.outages = Outages(app)
        self.dead = None
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.kill = threading.Event()  # the stop's wait is over: kill what still runs (REQ)
        self.running = 0
        self.runs = self.succeeded = self.failed = self.given_up = self.dead_lettered = 0
        self.last = time.monotonic()
        self.stdout_error: BaseException | None = None
        self.consumer = Consumer(topic, channel, self, config=cfg,
                                 on_error=lambda e: source_error(self.outages, e),
                                 nsqd_tcp_addresses=nsqd_addresses(conn),
                                 lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))

    # -- the harness ------------------------------------------------------------------------------
    def consumers(self) -> list:
        return [self.consumer]

    def start(self, deadline, stopper) -> None:
        if self.dead_letter_topic:
            self.dead = open_dead_letters(self.app, self.conn, self.topic, self.dead_letter_topic, deadline,
                                          self.outages, cancel=self.done.is_set)
        if not self.done.is_set():  # (a signal during the lookup above: stop() follows)
            self.consumer.start(deadline=deadline)

    def last_progress(self) -> float:
        return self.last

    def stop(self, end) -> None:
        """No new runs; the running ones may finish (STOP_WAIT, or until ``end``), then they
        are killed and requeued; dead letters published; the consumer closed."""
        wait = STOP_WAIT if end is None else max(0.05, end - 0.2 - time.monotonic())
        self.consumer.drain(timeout=wait)  # CLS, then until the handlers are done
        if self.running:
            self.kill.set()
            self.consumer.drain(timeout=5.0 if end is None else max(0.05, end - time.monotonic()))
        if self.dead is not None:
            self.dead.close(10.0 if end is None else max(0.05, end - time.monotonic()))
        self.consumer.stop(timeout=15.0 if end is None else max(0.05, min(15.0, end - time.monotonic())))

    def status_lines(self, elapsed: float) -> list[str]:
        return [self.status(elapsed)]

    def status(self, elapsed: float) -> str:
        dead = f", dead-lettered {self.dead_lettered:,}" if self.dead_letter_topic else ""
        return (f"ran {self.runs:,}: succeeded {self.succeeded:,}, failed {self.failed:,} (requeued or given up), "
                f"given up {self.given_up:,}{dead}, {self.succeeded / max(elapsed, 1e-9):,.1f} msg/s")

    def counters(self) -> dict:
        return {"runs": self.runs, "succeeded": self.succeeded, "failed_runs": self.failed,
                "given_up": self.given_up, "dead_lettered": self.dead_lettered,
                "dead_letter_failures": self.dead.failed if self.dead is not None else 0}

    def gauges(self) -> dict:
        return {"running": self.running}

    def working(self) -> bool:
        return self.running > 0  # a long command is TOUCHed, not stuck

    def problems(self) -> list[str]:
        return ["the dead-letter topic cannot be published to"] if "dead-letter" in self.outages.failing() else []

    def finish(self, elapsed, expired, settings, app) -> None:
        e = self.stdout_error
        if isinstance(e, BrokenPipeError):
            from ..app import StdoutClosed

            raise StdoutClosed()
        if e is not None:
            from ...errors import NSQError

            raise NSQError(f"cannot write to stdout: {getattr(e, 'strerror', None) or e}")
        done = self._done_count()
        short = expired and self.count and done < self.count
        if not short:
            app.info(self.status(elapsed))
        if settings.as_json:
            from ..harness import write_json

            write_json({"topic": self.topic, "channel": self.channel, "runs": self.runs,
                        "succeeded": self.succeeded, "failed_runs": self.failed, "given_up": self.given_up,
                        "dead_lettered": self.dead_lettered, "elapsed": round(elapsed, 3)})
        if short:
            from ..app import DeadlineExceeded

            raise DeadlineExceeded(f"--timeout passed after {done} of {self.count} messages done")

    # -- the consumer's handler threads -------------------------------------------------------------
    def _done_count(self) -> int:
        return self.succeeded + self.given_up + self.dead_lettered

    def _claim(self) -> bool:
        with self.lock:
            if self.count and self._done_count() + self.running >= self.count:
                return False
            self.running += 1
            return True

    def _release(self) -> None:
        """A message answered for good or given back: one run fewer, -n looked at. Once -n is
        done nothing more is taken (RDY 0), and only then is ``done`` set, which has the held
        messages given back: given back while nsqd could still send, a message came straight
        back, was given back again, and so on until the RDY 0 or the CLS (92 REQs for 8
        messages with the thread that set ``done`` descheduled before its RDY 0)."""
        with self.lock:
            self.running -= 1
            self.last = time.monotonic()
            finished = bool(self.count) and self._done_count() >= self.count and not self.done.is_set()
        if finished:  # (meanwhile a held message finds no room: it stays held)
            self.consumer.set_max_in_flight(0)
            self.done.set()

    def __call__(self, m) -> None:
        m.disable_auto_response()
        if not self._wait_for_room(m):  # stopping, or -n was done: back at once
            m.requeue(delay=0, backoff=False)
            return
        later = False
        try:
            later = self._handle(m)
        except BaseException:
            if not m.responded:
                m.requeue(delay=0, backoff=False)
            raise
        finally:
            if not later:
                self._release()

    def _wait_for_room(self, m) -> bool:
        """Claim a run for ``m``; while -n is taken by runs still going, hold it (TOUCHed): one of
        them may fail and leave room. Given back at once, it came straight back: a loop of
        redeliveries, its attempts up by hundreds a second. False when stopping."""
        touches = None
        while not self.done.is_set():
            if self._claim():
                return True
            now = time.monotonic()
            if touches is None:  # (asked only when it has to wait)
                touches = _Touches(self.consumer, m, now)
            else:
                touches.due(now)
            self.done.wait(0.05)
        return False

    def _handle(self, m) -> bool:
        """Run the command for ``m`` and answer it; True when the dead-letter thread answers it."""
        msg_id = m.id.decode("ascii", "replace")
        code, error, out, err = self._run(m, msg_id)
        with self.lock:
            self.runs += 1
        if out:
            self._write(out)
        if err:
            self._write_err(err)
        if code is None and error == "stopped":  # killed by the stop: not the message's fault
            m.requeue(delay=0, backoff=False)
            return False
        if code == 0:
            m.finish()
            self.outages.ok("command", "the command")
            with self.lock:
                self.succeeded += 1
            return False
        with self.lock:
            self.failed += 1
        said = _last_line(err)  # the dead letter's error: what the command said last
        said = f": {said}" if said else ""
        if code is not None and code in self.give_up_codes:
            return self._give_up(m, msg_id, f"{error} (--give-up-exit-code){said}")
        if self.max_attempts and m.attempts >= self.max_attempts:
            return self._give_up(m, msg_id,
                                 f"{error} (attempt {m.attempts} of --max-attempts {self.max_attempts}){said}")
        delay = min(900.0, self.requeue_delay * max(1, m.attempts))
        self.outages.failed("command", f"the command failed: {error} (message {msg_id}, attempt {m.attempts}); "
                                       "requeued with backoff")
        m.requeue(delay=delay, backoff=True)
        return False

    def _give_up(self, m, msg_id: str, error: str) -> bool:
        if self.dead is not None:
            def dead_done(ok: bool) -> None:
                if ok:
                    with self.lock:
                        self.dead_lettered += 1
                self._release()

            self.dead.submit(m, error, min(900.0, self.requeue_delay * max(1, m.attempts)), dead_done)
            return True
        m.finish()
        with self.lock:
            self.given_up += 1
        self.app.warn(f"gave up on message {msg_id} after {m.attempts} attempt{'s' if m.attempts != 1 else ''}: "
                      f"{error}; FINed")
        return False

    def _write(self, out: bytes) -> None:
        """COMMAND's stdout, one run's in one piece. A closed stdout (``| head``) ends the run
        (exit 0, like tail); another failure of stdout ends it with that error."""
        with self.out_lock:
            if self.stdout_error is not None:
                return
            try:
                sys.stdout.buffer.write(out)
                sys.stdout.flush()
            except (OSError, ValueError) as e:
                self.stdout_error = e
                self.done.set()

    def _write_err(self, err: bytes) -> None:
        """COMMAND's stderr, one run's in one piece, under the lock of nsqcli's own lines."""
        from ..app import _stderr_lock

        with _stderr_lock:
            try:
                sys.stderr.flush()
                sys.stderr.buffer.write(err if err.endswith(b"\n") else err + b"\n")
                sys.stderr.buffer.flush()
            except (OSError, ValueError, AttributeError):  # stderr closed: nowhere to say it
                pass

    def _run(self, m, msg_id: str) -> tuple[int | None, str, bytes, bytes]:
        """(exit code or None, what happened, its stdout, its stderr): see nsqcli/cli/child.py."""
        from ..child import run_child

        env = dict(os.environ, NSQ_TOPIC=self.topic, NSQ_CHANNEL=self.channel, NSQ_MESSAGE_ID=msg_id,
                   NSQ_ATTEMPTS=str(m.attempts), NSQ_TIMESTAMP=str(m.timestamp))
        started = time.monotonic()
        touches = _Touches(self.consumer, m, started)

        def tick(now: float) -> str | None:
            if self.kill.is_set():
                return "stopped"
            if self.command_timeout is not None and now - started >= self.command_timeout:
                return f"killed after --command-timeout {self.command_timeout:g}s"
            touches.due(now)
            return None

        return run_child(self.argv, env, m.body, tick, slice=SLICE)


class _Touches:
    """TOUCH ``m`` every half of nsqd's message timeout (the smallest its connections were
    granted in IDENTIFY) while it is held: waiting for a run, or while its command runs."""

    def __init__(self, consumer, m, now: float):
        timeouts = consumer.msg_timeouts()
        self.every = (min(timeouts) if timeouts else (consumer.config.msg_timeout or 60.0)) / 2
        self.m, self.next = m, now + self.every

    def due(self, now: float) -> None:
        if now >= self.next:
            self.next = now + self.every
            try:
                self.m.touch()
            except Exception:  # the connection is gone: nsqd redelivers the message anyway
                pass
