"""``nsqcli bench pub|sub|pubsub``: how fast is this cluster (and nsqcli's own core)?

Publishers put a send timestamp (8 bytes, ns) at the start of every body; consumers measure
end-to-end latency from it. Clients are threads (``--processes``: one process each, as Python
threads share one interpreter lock)."""

from __future__ import annotations

import json
import queue
import threading
import time

import click

from ...loadgen import STAMP, consumer, guarded, percentiles, publisher
from ..command import Command, Group, option
from ..options import (build_config, check_timeout, connection_options, deadline_of, nsqd_addresses,
                       pop_connection, resolve_producers, timeout_option, topic_arguments)
from ..types import DURATION

def _report(results, size, as_json, app):
    from ..app import write_stdout

    doc = {}
    for kind in ("pub", "sub"):
        rows = sorted((r for r in results if r[0] == kind), key=lambda r: r[1])
        if not rows:
            continue
        total_msgs = sum(r[2] for r in rows)
        wall = max(r[4] for r in rows)
        clients = [{"client": r[1], "messages": r[2], "seconds": round(r[4], 3),
                    "msgs_per_sec": round(r[2] / r[4], 1) if r[4] else 0.0,
                    "mb_per_sec": round(r[3] / r[4] / 1e6, 3) if r[4] else 0.0} for r in rows]
        section = {"messages": total_msgs, "seconds": round(wall, 3),
                   "msgs_per_sec": round(total_msgs / wall, 1) if wall else 0.0,
                   "mb_per_sec": round(total_msgs * size / wall / 1e6, 3) if wall else 0.0, "clients": clients}
        if kind == "sub":
            for c, r in zip(clients, rows):
                c["latency_ms"] = percentiles(r[5])
            section["latency_ms"] = percentiles([v for r in rows for v in r[5]])
        doc[kind] = section
    if as_json:
        write_stdout(json.dumps(doc) + "\n")
        return
    lines = []
    for kind, name in (("pub", "Pub"), ("sub", "Sub")):
        if kind not in doc:
            continue
        s = doc[kind]
        lines.append(f"{name}: {s['msgs_per_sec']:,.0f} msgs/s ~ {s['mb_per_sec']:,.2f} MB/s "
                     f"({s['messages']:,} msgs in {s['seconds']:.2f}s)")
        for c in s["clients"]:
            lat = c.get("latency_ms")
            lines.append(f"  [{c['client'] + 1}] {c['msgs_per_sec']:>12,.0f} msgs/s ~ {c['mb_per_sec']:,.2f} MB/s "
                         f"({c['messages']:,} msgs)" + (f"  latency p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms"
                                                         if lat else ""))
        if s.get("latency_ms"):
            lat = s["latency_ms"]
            lines.append(f"  end-to-end latency: p50 {lat['p50']:.2f} ms, p90 {lat['p90']:.2f} ms, "
                         f"p99 {lat['p99']:.2f} ms, p99.9 {lat['p99.9']:.2f} ms, max {lat['max']:.2f} ms")
    write_stdout("\n".join(lines) + "\n")


def run_bench(app, mode, topic, channel, size, count, duration, batch_size, publishers, consumers, max_in_flight,
              processes, as_json, conn, deadline: float | None = None):
    """``deadline`` (--timeout, monotonic): looked at by every wait here, which then raises
    DeadlineExceeded (exit 3) and stops the clients - not an alarm raising wherever the main
    thread is (nsqcli.cli.signals says why)."""
    count = _check_amount(size, count, duration)
    late = _Late(mode, deadline)
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    if processes:
        _quiet_children()
    addresses = nsqd_addresses(conn)
    lookupds = list(conn.get("lookupd_http_addresses") or ())
    if mode != "sub" and not addresses:
        from ...errors import NSQError

        try:
            addresses = resolve_producers(app, conn, topic, deadline)
        except NSQError:
            late.check(0.01)  # the lookup ran out of time with --timeout: exit 3, not its error
            raise
        late.check()
    pub_cfg = build_config(conn)
    sub_cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0)
    # threads: a plain queue. A multiprocessing queue pickles in a feeder thread: a thread that
    # put its 400k latencies and ended looked like "no result yet, no worker alive" (the loop
    # gave up), and the exit then hung for ever joining a feeder blocked on the full pipe
    out = ctx.Queue() if processes else queue.Queue()
    progress, received, ready = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
    stop = ctx.Event() if processes else threading.Event()
    make = (lambda target, args: ctx.Process(target=target, args=args, daemon=True)) if processes else \
        (lambda target, args: threading.Thread(target=target, args=args, daemon=True))
    workers = []
    if mode in ("sub", "pubsub"):
        total = count if mode == "sub" else count * publishers if count else 0
        for j in range(consumers):
            workers.append(make(guarded(consumer), (j, addresses, lookupds, sub_cfg, topic, channel, size, total,
                                            duration, received, stop, out, ready, mode == "pubsub")))
    if mode in ("pub", "pubsub"):
        per = count if count else 0
        pub_stop = stop if mode == "pub" else (ctx.Event() if processes else threading.Event())
        for i in range(publishers):
            workers.append(make(guarded(publisher), (i, addresses, pub_cfg, topic, size, per, duration, batch_size,
                                             progress, pub_stop, out)))
    try:
        _start(workers, mode, consumers, ready, late)
    except BaseException:
        stop.set()
        raise
    expected = (publishers if mode != "sub" else 0) + (consumers if mode != "pub" else 0)
    bar = _Bar(app, mode, count, publishers, progress, received) if app.stderr_is_tty and not as_json else None
    results = _collect(workers, out, expected, stop, bar, late)
    from ...errors import NSQError

    errors = [r for r in results if r[0] == "error"]
    if errors:
        raise NSQError(f"{len(errors)} bench client(s) failed: {errors[0][2]}")
    if len(results) < expected:
        raise NSQError(f"{expected - len(results)} bench client(s) ended without a result")
    _report(results, size, as_json, app)
    return 0


def _check_amount(size: int, count, duration):
    """(usage) --size, --count or --duration: the count (100000 when neither was given)."""
    if size < STAMP.size:
        raise click.BadParameter(f"must be at least {STAMP.size} (the timestamp)", param_hint="'--size'")
    if duration is not None and duration <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--duration'")
    if count and duration:
        raise click.UsageError("give --count or --duration, not both")
    if not count and not duration:
        count = 100_000
    return count


_quieted = False
_clients_of: int | None = None  # the pid forking bench clients at this moment, else None


def _quiet_children() -> None:
    """--processes: a forked client takes SIGINT/SIGTERM as the default does (ends, silently)
    unless this process ignores it (a background job's SIGINT stays ignored), not with nsqcli's
    handlers (each client would say "interrupted" as Ctrl-C, or the exit, ends it). Set in the
    child as it is forked (os.register_at_fork): no moment where the parent's handler is its.
    On Linux a client also ends with the bench, however the bench ends: `kill PID` or kill -9
    of the bench alone (not its process group) left its clients publishing. The hook acts on
    the forks :func:`_launch` makes only (a process embedding nsqcli forks for its own ends)."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    import os

    from ... import sandbox  # noqa: F401 - the clients' _end_with finds it imported

    os.register_at_fork(after_in_child=_as_client)


def _launch(worker) -> None:
    """``worker.start()``: a process client is forked as a client (see :func:`_as_client`)."""
    global _clients_of
    import os

    _clients_of = os.getpid()
    try:
        worker.start()
    finally:
        _clients_of = None


def _as_client() -> None:
    """(the fork hook, in every child) Only in a client :func:`_launch` forked: the default
    SIGINT/SIGTERM/SIGHUP, and the end with its parent. The child's own forks are not clients."""
    global _clients_of
    parent, _clients_of = _clients_of, None
    if parent is None:
        return
    import signal

    from ...exits import STOP_SIGNALS

    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    _end_with(parent)


def _end_with(parent: int) -> None:
    """(in a forked client) SIGKILL when the process that forked it ends (PR_SET_PDEATHSIG; the
    clients are forked by the main thread, whose end is the process's). Ended at once when the
    parent is already gone. A client has nothing to save: its counts went to the parent."""
    import os
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    from ...sandbox import die_with_parent  # imported by _quiet_children, before the forks

    if die_with_parent(signal.SIGKILL) and os.getppid() != parent:  # it ended before the ask
        os._exit(1)


class _Late:
    """--timeout for the bench's waits."""

    def __init__(self, mode: str, deadline: float | None):
        self.mode, self.deadline = mode, deadline

    def check(self, margin: float = 0.0) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline - margin:
            from ..app import DeadlineExceeded

            raise DeadlineExceeded(f"--timeout passed before 'bench {self.mode}' was done")


def _start(workers: list, mode: str, consumers: int, ready, late: _Late) -> None:
    """Start the clients; pubsub: the consumers first (up to 15 s for them to be ready)."""
    if mode == "pubsub":
        # consumers first: the channel exists before the first message, so none is a backlog
        for w in workers[:consumers]:
            _launch(w)
        deadline = time.monotonic() + 15
        while ready.value < consumers and time.monotonic() < deadline and any(w.is_alive() for w in workers):
            late.check()
            time.sleep(0.01)
        for w in workers[consumers:]:
            _launch(w)
    else:
        for w in workers:
            _launch(w)


def _collect(workers: list, out, expected: int, stop, bar, late: _Late) -> list:
    """Every client's result (fewer when all ended without one); then the clients are told to stop."""
    results = []
    try:
        while len(results) < expected:
            late.check()
            try:
                results.append(out.get(timeout=0.2))
            except Exception:
                pass
            if bar:
                bar.update()
            alive = [w for w in workers if w.is_alive()]
            if not alive and out.empty() and len(results) < expected:
                break
    finally:
        stop.set()
        if bar:
            bar.stop()
    return results


class _Bar:
    def __init__(self, app, mode, count, publishers, progress, received):
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        self.progress_v, self.received_v = progress, received
        total = (count * publishers if mode != "sub" else count) or None
        self.p = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                          TextColumn("{task.completed:,.0f} msgs"), console=app.console, transient=True)
        self.pub = self.p.add_task("published", total=total) if mode != "sub" else None
        self.sub = self.p.add_task("received ", total=total) if mode != "pub" else None
        self.p.start()

    def update(self):
        if self.pub is not None:
            self.p.update(self.pub, completed=self.progress_v.value)
        if self.sub is not None:
            self.p.update(self.sub, completed=self.received_v.value)

    def stop(self):
        self.update()
        self.p.stop()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def bench():
    """How fast is this cluster? Publish, consume, or both, and report msgs/s, MB/s and
    end-to-end latency percentiles (from a timestamp in each body), per client and in total.

    \b
    It measures nsqcli's own client core too: see the README for the figures next to the
    official bench_writer/bench_reader on the same machine.

    \b
    Examples:
      nsqcli bench pubsub -n 200000 --size 100
      nsqcli bench pub --publishers 4 --processes --duration 10s --json
      nsqcli bench sub -t bench_backlog --consumers 2 -n 1000000
    """


def _mode_command(mode: str, doc: str):
    @click.command(mode, cls=Command, help=doc, examples={
        "pub": "nsqcli bench pub -n 1000000 --size 100 --batch-size 200\nnsqcli bench pub --publishers 2 --processes --duration 10s",
        "sub": "nsqcli bench pub -t backlog -n 500000 && nsqcli bench sub -t backlog -n 500000",
        "pubsub": "nsqcli bench pubsub -n 200000\nnsqcli bench pubsub --publishers 2 --consumers 2 --processes --json",
    }[mode])
    @topic_arguments(channel=True, topic_default="nsqcli_bench", channel_default="nsqcli_bench")
    @option("--size", type=click.IntRange(8, 1 << 20), default=100, show_default=True, help="Message size in bytes.")
    @option("-n", "--count", type=click.IntRange(1), default=None,
            help="Messages per publisher (sub: in total); default 100000 unless --duration.")
    @option("--duration", type=DURATION, help="Run this long instead of a count.")
    @option("--batch-size", type=click.IntRange(1, 100000), default=200, show_default=True, help="Messages per MPUB.")
    @option("--publishers", type=click.IntRange(1, 64), default=1, show_default=True)
    @option("--consumers", type=click.IntRange(1, 64), default=1, show_default=True)
    @option("--max-in-flight", type=click.IntRange(1, 100000), default=2500, show_default=True,
            help="Per consumer.")
    @option("--processes", is_flag=True, help="One process per client (threads share Python's interpreter lock).")
    @option("--json", "as_json", is_flag=True, help="The report as one JSON line on stdout.")
    @timeout_option("Give up (exit 3) if the bench has not finished by then (e.g. sub: fewer messages than -n).")
    @connection_options()
    @click.pass_obj
    def cmd(app, topic, channel, size, count, duration, batch_size, publishers, consumers, max_in_flight, processes,
            as_json, timeout, **kwargs):
        check_timeout(timeout)
        conn = pop_connection(kwargs)
        return run_bench(app, mode, topic, channel, size, count or 0, duration, batch_size, publishers, consumers,
                         max_in_flight, processes, as_json, conn, deadline_of(timeout))

    return cmd


bench.add_command(_mode_command("pub", "Publish as fast as nsqd acknowledges (pipelined MPUBs)."))
bench.add_command(_mode_command("sub", "Consume what is in the topic (e.g. after 'bench pub')."))
bench.add_command(_mode_command("pubsub", "Publish and consume at once: throughput and end-to-end latency."))
