"""The run of every long-running command (to-file, to-nsq, to-http, tail), written once.

A command builds a :class:`Job` (its consumers, what it counts, how it stops) and hands it to
:func:`run` with the :class:`Settings` its options made. The harness does the rest, the same
way for every command:

- signals: the first SIGINT/SIGTERM stops the work at its next safe point (a second forces
  the exit), a signal while connecting ends the run at once (130/143);
- ``--timeout``: the whole command's deadline, counted from process start; connecting spends
  it too; past it the stop has a short grace and the run ends with exit 3 when the work
  (``-n``) was not done;
- ``--idle-timeout``: stop after no message for that long;
- the live view (``--live/--no-live``) where stderr is a terminal rich can draw on, status
  lines every ``--status-interval`` everywhere else (a pipe, a journal, TERM=dumb);
- ``--metrics-address`` (Prometheus /metrics and /healthz), ``--status-file`` (the same
  snapshot as JSON), systemd's notify socket (READY, STATUS, WATCHDOG, STOPPING);
- the drain and stop, the end-of-run summary line and its ``--json``.

Click-free: to-file runs it after a hand-off to a fresh image (nsqcli.cli.handoff).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

#: how often the wait loop turns (signals, deadlines, outages, the watchdog)
TICK = 0.1
#: the status file is replaced this often (a file a monitor reads should not be a minute old)
STATUS_FILE_EVERY = 5.0
#: channel depth (lag) is asked of nsqd this often, when something shows it
LAG_EVERY = 15.0
#: /healthz says "stuck" when the wait loop has not turned for this long
LOOP_STUCK_AFTER = 10.0
#: ... or when messages are held and none was answered for this long (at least)
ANSWERS_STUCK_AFTER = 120.0
#: after --timeout passed, what the stop may still take (REQ or FIN what is in flight, close)
STOP_GRACE = 0.35
#: after a signal cut a start short: how long its thread is given to end (handshakes and lookup
#: rounds end at once; this bounds any other wait) before the exit, or, with a connection up,
#: before the clean stop
START_ABORT = 1.0
START_ABORT_CONNECTED = 10.0


class Settings:
    """What the shared run options asked for (nsqcli.cli.options.daemon_options). (Not a
    dataclass: that would load inspect and ast into to-file's handed-off image.)"""

    def __init__(self, *, live: bool | None = None, status_interval: float = 60.0, as_json: bool = False,
                 deadline: float | None = None, idle_timeout: float | None = None,
                 metrics_address: str | None = None, status_file: str | None = None,
                 log_format: str | None = None, log_level: str = "info"):
        self.live = live                          # None: when stderr is a terminal rich can draw on
        self.status_interval = status_interval    # 0: no status lines
        self.as_json = as_json
        self.deadline = deadline                  # --timeout (monotonic)
        self.idle_timeout = idle_timeout
        self.metrics_address = metrics_address
        self.status_file = status_file
        self.log_format = log_format              # plain | text | json
        self.log_level = log_level


class Job:
    """What a command gives the harness. ``done`` is set by the command when its work is done
    (``-n`` reached, stdout closed) and by the harness to stop."""

    name = "job"
    connecting = "connecting"  # what start() does, for the --timeout line
    handles_hup = False       # True: start() installs its own SIGHUP handler (to-file: close and move the files)
    nothing_done = ""        # said after a --timeout while connecting, e.g. "nothing was copied"

    def __init__(self):
        self.done = threading.Event()
        self.outages = None      # nsqcli.cli.app.Outages, when the command reports its errors there
        self.started = time.monotonic()
        self.consumers_lock = threading.Lock()  # start_consumer's registration, against interrupt()

    # -- what it runs ------------------------------------------------------------------------
    def consumers(self) -> list:
        return []

    def install_signals(self) -> None:
        """(the main thread, before start) Handlers of the job's own (``handles_hup``)."""

    def start(self, deadline: float | None, stopper) -> None:
        """Connect (within ``deadline``). It runs on a thread of its own: a signal meanwhile
        sets ``done`` and calls :meth:`interrupt` from the main thread, then the run ends with
        130/143 when nothing is connected, else with the clean stop. So start() checks ``done``
        before each consumer it starts, and every consumer it starts is in ``consumers()``
        first (``start_consumer``), for interrupt() to cut its start short and stop() to drain
        it or close what it is still dialing."""

    def interrupt(self) -> None:
        """(the main thread; ``done`` is set) A signal came while start() runs: no new
        connection from here on, and the handshakes in progress fail at once."""
        for c in self.consumers():
            c.interrupt()

    def connected(self) -> bool:
        """Whether any consumer has a connection (so may hold messages)."""
        return any(c.connections for c in self.consumers())

    def start_consumer(self, c, deadline: float | None, into: list, lock=None) -> None:
        """``c`` goes into ``into`` (what consumers() returns; under ``lock``, by default
        ``consumers_lock``, which consumers() must take too), then ``c.start(deadline=deadline)``
        - unless the run is stopping already, then neither. Taken out again when the start
        failed: it left nothing behind."""
        from ..errors import NSQError

        lock = lock if lock is not None else self.consumers_lock
        with lock:  # checked and added at once: interrupt() (after done.set()) sees it, or it sees done
            if self.done.is_set():
                return
            into.append(c)
        try:
            c.start(deadline=deadline)
        except NSQError:
            with lock:
                into.remove(c)
            raise

    def tick(self, now: float) -> None:
        """Called every turn of the wait loop (the main thread)."""

    def last_progress(self) -> float:
        """time.monotonic() of the last message (for --idle-timeout)."""
        return self.started

    def stop(self, end: float | None) -> None:
        """Drain and stop; with ``end`` (monotonic), be done by then."""
        for c in self.consumers():
            c.stop(timeout=15.0 if end is None else max(0.05, min(15.0, end - time.monotonic())))

    # -- what it says ------------------------------------------------------------------------
    def status_lines(self, elapsed: float) -> list[str]:
        return []

    def finish(self, elapsed: float, expired: bool, settings: Settings, app) -> None:
        """After the stop: the summary line, the --json, and DeadlineExceeded / NSQError when
        the work was not done."""

    def live_view(self, console):
        from .views import LiveConnections

        return LiveConnections(console, self.consumers())

    # -- what it counts (the snapshot: nsqcli.daemon.metrics, the status file) -------------------
    def topic_rows(self) -> list[dict]:
        """Per topic/channel, cumulative over the process's life."""
        rows = []
        for c in self.consumers():
            t = c.totals()
            rows.append({"topic": c.topic, "channel": c.channel, "received": t["received"],
                         "finished": t["finished"], "requeued": t["requeued"], "timed_out": t["timed_out"],
                         "lost_responses": t["lost_responses"]})
        return rows

    def counters(self) -> dict:
        return {}

    def gauges(self) -> dict:
        return {}

    def latency(self) -> dict | None:
        return None

    def errors(self) -> dict:
        """Errors by kind the outages do not count (to-file's failed writes)."""
        return {}

    def problems(self) -> list[str]:
        """Why the work cannot go on now (a write failing, a destination down): /healthz 503."""
        return []

    def working(self) -> bool:
        """Work on held messages is under way (exec's commands running, TOUCHed): held
        messages without an answer are then not "stuck"."""
        return False


def can_draw(app) -> bool:
    """stderr is a terminal rich can drive (not TERM=dumb or unknown, not too small)."""
    if not app.stderr_is_tty:
        return False
    from . import views

    check = getattr(views, "can_draw_live", None)
    if check is not None:
        return bool(check(app.console))
    return not app.console.is_dumb_terminal


def why_not_draw(app) -> str:
    """Why :func:`can_draw` is False, for the --live warning."""
    if not app.stderr_is_tty:
        return "stderr is not a terminal"
    from . import views

    check = getattr(views, "cannot_draw_live", None)
    return (check(app.console) if check is not None else "") or "TERM=dumb"


class Harness:
    def __init__(self, app, job: Job, settings: Settings):
        self.app, self.job, self.s = app, job, settings
        self.state = "starting"
        self.started_at = time.time()
        self.started = time.monotonic()
        self.last_tick = self.started
        self.depth: list[dict] = []
        self._lag = None
        self._lag_thread: threading.Thread | None = None
        self._lag_due = 0.0
        self._answers = (-1, self.started)  # (finished + requeued, when it last changed)
        self.metrics = None
        self.status_file = None
        self.notifier = None
        self._status_file_error = None

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        from ..errors import NSQError
        from ..exits import Interrupted, stop_signals
        from .app import DeadlineExceeded
        from .signals import GracefulStop

        job, s = self.job, self.s
        self._setup_logs()
        self._open_outputs()  # a metrics port in use fails before anything connects
        import signal

        # SIGHUP (a closed terminal, a reload): a clean stop like SIGTERM, unless the job has its own use for it
        stopper = GracefulStop(job.done).install(stop_signals(own_hup=job.handles_hup))
        if signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:  # a stuck daemon says where it is
            import faulthandler

            faulthandler.register(signal.SIGUSR1, all_threads=True)
        job.install_signals()
        expired = False
        try:
            try:
                self._start(stopper)
            except Interrupted:
                if not job.connected():
                    raise
                # once a connection is up, a signal is the clean stop it is a moment later
                # (drain, sync, FIN, exit 0), even if it came before start() returned
            except NSQError as e:
                if s.deadline is not None and time.monotonic() >= s.deadline - 0.25:
                    raise DeadlineExceeded(f"--timeout passed while {job.connecting}: {e}"
                                           + (f"; {job.nothing_done}" if job.nothing_done else "")) from None
                raise
            self.state = "running"
            if self.notifier is not None:
                self.notifier.ready(self._one_line())
            with self._view():
                expired = self._wait()
        finally:
            self.state = "stopping"
            job.done.set()
            if self.notifier is not None:
                self.notifier.stopping()
            try:  # with --timeout, the stop too ends within STOP_GRACE of it
                job.stop(None if s.deadline is None else max(s.deadline, time.monotonic()) + STOP_GRACE)
            finally:
                self._close_outputs()
        job.finish(time.monotonic() - job.started, expired, s, self.app)
        return 0

    def _setup_logs(self) -> None:
        """--log-format text/json: the daemon's logger (and the exit's line as a JSON record);
        plain: --log-level on the 'nsqcli: ...' lines."""
        s = self.s
        if self.app.logger is not None:
            return
        if s.log_format in ("text", "json"):
            from ..daemon.logs import setup
            from .app import write_stderr

            self.app.logger = setup(self.job.name, s.log_level, s.log_format, write=write_stderr)
            if s.log_format == "json":  # the exit's line (error, interrupted) a JSON record too
                from . import app as app_module

                app_module.json_exit_log = self.app.logger
        elif s.log_format == "plain":
            if s.log_level == "debug":
                self.app.verbosity = max(self.app.verbosity, 1)
            if s.log_level in ("warn", "error"):
                self.app.info = lambda *a, **k: None
            if s.log_level == "error":
                self.app.warn = lambda *a, **k: None

    def _start(self, stopper) -> None:
        """job.start() on a thread of its own (nsqcli.cli.signals says why: a signal must never
        raise inside code that takes locks). A signal meanwhile: nothing more starts, what is
        dialing or asking a lookupd ends at once, and Interrupted is raised once the start has
        ended - or after START_ABORT (nothing connected) / START_ABORT_CONNECTED seconds, should
        it be in some other wait."""
        from ..exits import Interrupted
        from .signals import Call

        job = self.job
        call = Call(lambda: job.start(self.s.deadline, stopper), name="nsqcli-start")
        try:
            stopper.wait_for(call)
        except Interrupted:
            job.done.set()  # here, not in the handler: start() sees it before its next consumer
            job.interrupt()
            if not call.wait(START_ABORT) and job.connected():  # stop() must not race a start still adding
                most = START_ABORT_CONNECTED
                if self.s.deadline is not None:  # nor pass --timeout's own end
                    most = min(most, self.s.deadline + STOP_GRACE - time.monotonic())
                call.wait(max(0.0, most))
            raise

    def _wait(self) -> bool:
        """Until done; True when --timeout ended the run."""
        job, s = self.job, self.s
        next_status = self.started + s.status_interval if s.status_interval and not self.drawing else None
        next_file = 0.0
        watchdog = self.notifier.watchdog_interval() if self.notifier is not None else None
        next_dog = 0.0
        while True:
            now = time.monotonic()
            self.last_tick = now
            if s.deadline is not None and now >= s.deadline:
                return True
            if job.done.wait(TICK if s.deadline is None else max(0.0, min(TICK, s.deadline - now))):
                return False
            now = time.monotonic()
            self.last_tick = now
            if s.idle_timeout and now - max(job.last_progress(), job.started) >= s.idle_timeout:
                return False
            job.tick(now)
            if job.outages is not None:  # connections up and down, recoveries, reminders while down
                job.outages.check(job.consumers())
            self._poll_lag(now, wanted=next_status is not None)
            if next_status is not None and now >= next_status:
                next_status = now + s.status_interval
                for line in job.status_lines(now - job.started) + self._lag_lines():
                    self.app.info(line)
                if self.notifier is not None:
                    self.notifier.status(self._one_line())
            if self.status_file is not None and now >= next_file:
                next_file = now + STATUS_FILE_EVERY
                self._write_status_file()
            if watchdog and now >= next_dog:  # only while this loop turns: a hung loop gets restarted
                next_dog = now + watchdog
                self.notifier.watchdog()

    # -- the live view or status lines -----------------------------------------------------------
    @contextmanager
    def _view(self):
        self.drawing = False
        want = self.s.live
        view = None
        if want is not False:
            if can_draw(self.app):
                view = self.job.live_view(self.app.console)
            elif want:
                self.app.warn(f"--live needs a terminal on stderr that can draw ({why_not_draw(self.app)}): "
                              "status lines instead" + ("" if self.s.status_interval else
                                                        " (none: --status-interval is 0)"))
        if view is None:
            yield
            return
        self.drawing = True
        view.start()
        try:
            yield
        finally:
            view.stop()

    # -- lag: channel depth as nsqd sees it ------------------------------------------------------
    def _poll_lag(self, now: float, wanted: bool) -> None:
        if not (wanted or self.metrics is not None or self.status_file is not None):
            return
        if now < self._lag_due or (self._lag_thread is not None and self._lag_thread.is_alive()):
            return
        self._lag_due = now + LAG_EVERY
        targets = sorted({(c.topic, c.channel, st.address) for c in self.job.consumers() for st in c.stats()})
        if not targets:  # every connection gone: no depth to show (not the last one seen)
            self.depth = []
            return
        if self._lag is None:
            from ..daemon.lag import Lag

            self._lag = Lag()

        def poll():
            try:
                self.depth = self._lag.poll(targets, timeout=5.0)
            except Exception:  # lag is a view: never worth stopping the work for
                pass

        self._lag_thread = threading.Thread(target=poll, name="nsqcli-lag", daemon=True)
        self._lag_thread.start()

    def _lag_lines(self) -> list[str]:
        if not self.depth:
            return []
        depth = sum(r["depth"] for r in self.depth)
        deferred = sum(r.get("deferred", 0) for r in self.depth)
        nodes = len({r["nsqd"] for r in self.depth})
        return [f"lag: {depth:,} messages waiting in nsqd ({nodes} nsqd"
                + (f", {deferred:,} deferred" if deferred else "") + ")"]

    # -- the snapshot ------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        job = self.job
        now = time.time()
        consumers = list(job.consumers())
        connections = []
        for c in consumers:
            for st in c.stats():
                connections.append({"topic": c.topic, "channel": c.channel, "nsqd": st.address,
                                    "state": st.state, "connected": st.connected_at is not None,
                                    "rdy": st.rdy, "in_flight": st.in_flight,
                                    "connected_since": st.connected_at})
        topics = job.topic_rows()
        errors = {"source": 0, "lookupd": 0}
        counts = getattr(job.outages, "counts", None)
        if counts is not None:
            errors.update(counts())
        errors.update(job.errors())
        snap = {"command": job.name, "pid": os.getpid(), "started_at": self.started_at,
                "uptime_seconds": round(time.monotonic() - self.started, 3), "state": self.state,
                "topics": topics, "connections": connections, "depth": list(self.depth),
                "counters": job.counters(), "gauges": job.gauges(), "errors": errors,
                "latency": job.latency()}
        snap["health"] = self._health(snap, now)
        return snap

    def _health(self, snap: dict, now: float) -> dict:
        reasons = list(self.job.problems())
        mono = time.monotonic()
        if self.state == "running" and mono - self.last_tick > LOOP_STUCK_AFTER:
            reasons.append(f"stuck: the main loop has not run for {mono - self.last_tick:.0f}s")
        down = self._sources_down()
        if down and not any(c["connected"] for c in snap["connections"]):
            reasons.append("every nsqd is down: " + ", ".join(down))
        held = sum(c["in_flight"] for c in snap["connections"])
        answered = sum(t["finished"] + t["requeued"] for t in snap["topics"])
        if answered != self._answers[0] or not held or self.job.working():
            self._answers = (answered, mono)
        elif mono - self._answers[1] > self._answers_stuck_after():
            reasons.append(f"stuck: {held} messages held and none answered for {mono - self._answers[1]:.0f}s")
        return {"ok": not reasons, "reason": "; ".join(reasons)}

    def _answers_stuck_after(self) -> float:
        timeouts = [t for c in self.job.consumers() for t in c.msg_timeouts()]
        return max([ANSWERS_STUCK_AFTER] + [2 * t for t in timeouts])

    def _sources_down(self) -> list[str]:
        outages = self.job.outages
        if outages is None:
            return []
        wall = time.time()
        out = []
        for key in outages.failing():
            if isinstance(key, tuple) and key[0] == "source" and key[1]:
                since = outages.down_since(key)
                out.append(f"{key[1]}" + (f" (for {wall - since:.0f}s)" if since else ""))
        return out

    def _one_line(self) -> str:
        lines = self.job.status_lines(time.monotonic() - self.job.started)
        if self.state == "starting" or not lines:
            n = len(self.job.consumers())
            return f"{self.job.name}: subscribed to {n} topic{'s' if n != 1 else ''}"
        return lines[0] if len(lines) == 1 else f"{self.job.name}: {len(lines)} topics"

    # -- metrics, status file, systemd -------------------------------------------------------------
    def _open_outputs(self) -> None:
        from ..errors import NSQError

        s = self.s
        if s.metrics_address:
            from ..daemon.metrics import serve

            try:
                self.metrics = serve(s.metrics_address, self.snapshot)
            except (OSError, ValueError) as e:
                raise NSQError(f"cannot serve metrics: {e}" if s.metrics_address in str(e) else
                               f"cannot serve metrics on {s.metrics_address}: {getattr(e, 'strerror', None) or e}") from None
            self.app.info(f"serving metrics on http://{self.metrics.address}/metrics and health on /healthz")
        if s.status_file:
            from ..daemon.statusfile import StatusFile

            self.status_file = StatusFile(s.status_file)
        from ..daemon.sdnotify import Notifier

        self.notifier = Notifier.from_env()

    def _write_status_file(self) -> None:
        try:
            self.status_file.write(self.snapshot())
        except OSError as e:  # (StatusFile's own error names the path already)
            text = str(e) if e.strerror is None else f"cannot write the status file {self.s.status_file}: {e.strerror}"
            if text != self._status_file_error:  # said once per new error, not every 5 s
                self._status_file_error = text
                self.app.warn(f"{text}; the work goes on")
        else:
            if self._status_file_error is not None:
                self.app.info(f"status file {self.s.status_file} written again")
            self._status_file_error = None

    def _close_outputs(self) -> None:
        if self.status_file is not None:
            self._write_status_file()  # the last state: "stopping"
        if self.metrics is not None:
            self.metrics.close()


def run(app, job: Job, settings: Settings) -> int:
    return Harness(app, job, settings).run()


def write_json(doc: dict) -> None:
    import json

    from .app import write_stdout

    write_stdout(json.dumps(doc) + "\n")
    sys.stderr.flush()
