"""``nsqcli stat``: poll nsqd /stats on every node and show rates, depth, warnings."""

from __future__ import annotations

import json
import sys
import threading
import time

import click

from ..command import command, option
from ..options import check_timeout, deadline_of, http_tls_options, setup_http_tls, timeout_option, topic_arguments
from ..types import DURATION, HTTP_ADDRESS
from ...clock import left

HEADER = ("------rate------+----------------depth----------------+--------------metadata---------------\n"
          "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients")
ROW = "{:7.0f} {:7.0f} | {:7d} {:7d} {:7d} {:5d} {:5d} | {:7d} {:7d} {:12d} {:7d}"


def discover(app, nsqd: list[str], lookupd: list[str], topic: str | None, said: set | None = None,
             first: bool = False, timeout: float = 5.0) -> list[str]:
    """nsqd HTTP addresses: the given ones and every node the lookupds know (carrying ``topic``),
    the lookupds asked at once within ``timeout``. A lookupd failure is said once (``said``
    remembers across polls) until it changes. On the ``first`` poll, no lookupd answering and
    no nsqd given is the one error (nothing to poll)."""
    if not lookupd:
        return nsqd
    from ...client.http import cluster_view

    view = cluster_view(lookupd, topic, timeout)
    said = set() if said is None else said
    if first and not view.answered and not nsqd:  # nothing to poll at all: one error, no warning
        from ...errors import NSQError
        from ..footguns import no_answer

        raise NSQError(no_answer(f"no nsqlookupd answered ({', '.join(lookupd)})", view.errors, "nsqlookupd"))
    for e in view.errors:
        if str(e) not in said:
            app.warn(f"nsqlookupd failed: {e}")
    said.clear()
    said.update(str(e) for e in view.errors)
    nodes = view.producers(topic) if topic else list(view.nodes.values())
    found = [n.http_address for n in nodes]
    given = {a.split("://", 1)[-1].rstrip("/") for a in nsqd}
    return list(nsqd) + sorted(a for a in found if a not in given)


@command(examples="""
nsqcli stat                                   # live dashboard on a terminal, rows otherwise
nsqcli stat -t events -c archive --interval 5s
nsqcli stat --lookupd-http-address 127.0.0.1:4161 --per-node
nsqcli stat --json -n 1 | jq '.rows[] | select(.depth > 1000)'
nsqcli stat --clients                          # also every consumer: RDY, in-flight, finished
""")
@topic_arguments(required=False, channel=True, topic_help="Only this topic (or the first argument).",
                 channel_help="Only this channel (with a topic)")
@option("--nsqd-http-address", "nsqd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS", show_envvar=True,
              help="nsqd HTTP address (repeatable). Default 127.0.0.1:4151 when no lookupd is given.")
@option("--lookupd-http-address", "lookupd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_LOOKUPD_HTTP_ADDRESS",
              show_envvar=True, help="Find the nsqd nodes through nsqlookupd (re-read every interval).")
@option("--interval", type=DURATION, default="2s", show_default=True)
@option("-n", "--count", type=click.IntRange(1), help="Print this many reports, then exit.")
@option("--per-node", is_flag=True, help="A row per node instead of summing over nodes.")
@option("--clients", is_flag=True, help="Also show every consumer (live view and --json).")
@option("--json", "as_json", is_flag=True, help="One NDJSON snapshot per interval on stdout.")
@option("--live/--no-live", default=None,
        help="Live dashboard (default: when stdout is a terminal that can draw it). Where rich cannot "
             "(TERM=dumb or unknown, TERM unset, smaller than 40x6), rows every --interval instead.")
@option("--http-client-request-timeout", "request_timeout", type=DURATION, default="5s", show_default=True,
        help="How long each poll waits for the nodes' answers (nodes are asked at once); "
             "a node that has not answered by then is reported down.")
@timeout_option("Stop then, counted from the start; exit 3 if --count reports were not printed by then "
                "(0 is refused).")
@http_tls_options
@click.pass_obj
def stat(app, topic, channel, nsqd, lookupd, interval, count, per_node, clients, as_json, live, request_timeout,
         timeout, **tls):
    """Poll nsqd /stats every --interval and report per topic/channel: ingress and egress rates,
    depth (memory/disk), in-flight, deferred, requeued, timed out, messages, clients.

    The first poll is the baseline for rates. Every node is asked at once: one that does not
    answer within --http-client-request-timeout is reported down (by address) and polling goes
    on - a hung node delays one report by that long, then is asked again in the background
    while the others are reported every --interval; exit 1 only if no node answered during
    the whole run.

    https:// addresses are verified with --tls-ca-file (else the system's CAs), --tls-cert and
    --tls-key; an nsqd started with --tls-required=true answers plain HTTP with its HTTPS port,
    which is then asked instead.
    """
    from ...client.stats import Poller, compute_rows
    from ..app import DeadlineExceeded

    _refuse_usage(interval, request_timeout, as_json, live, topic, channel)
    check_timeout(timeout)
    setup_http_tls(tls)
    deadline = deadline_of(timeout)
    nsqd, lookupd = list(nsqd), list(lookupd)
    if not nsqd and not lookupd:
        nsqd = ["127.0.0.1:4151"]
    live = _live(app, live, as_json)
    stop = threading.Event()
    from types import SimpleNamespace

    from ..signals import GracefulStop

    stopper = GracefulStop(stop).install()
    # the poll loop is one state machine over these locals (baseline, reports, nodes down): kept whole
    history: dict = {}
    last = None  # latest answer of every node, for rates
    reports = 0
    answered = False
    down_before: set[str] = set()
    lookupd_errors: set[str] = set()
    down: dict = {}  # the last poll's failed nodes, for the port hint if none ever answered
    view = _LiveView(app, clients) if live else None
    poller = Poller(topic, channel, clients=True)
    try:
        while not stop.is_set():
            def ask(first=last is None):
                said: list[str] = []  # warnings, said here once the call is back (never after "interrupted")
                nodes = _nodes(SimpleNamespace(warn=said.append), nsqd, lookupd, topic, lookupd_errors, first,
                               request_timeout, deadline)
                return nodes, poller.poll(nodes, _left(request_timeout, deadline)), said

            # a node that never answers: a signal ends the wait (130)
            nodes, sample, said = stopper.call(ask, "nsqcli-stat")
            for text in said:
                app.warn(text)
            down = sample.down
            if topic and last is None:
                _require_topic(topic, sample, lookupd, nodes, lookupd_errors)
            answered |= bool(sample.stats)
            rows = compute_rows(last, sample, per_node, history)
            for node in set(sample.down) - down_before:
                app.warn(f"nsqd {node} is down: {sample.down[node]}")
            down_before = set(sample.down)
            if last is not None or view is not None:
                reports += 1
                _report(view, rows, sample, interval, as_json, clients, reports, topic and channel and not per_node)
            last = _merge(last, sample)
            if count and reports >= count:
                break
            if deadline is not None and time.monotonic() + interval > deadline:
                stop.wait(max(0.0, deadline - time.monotonic()))
                if not stop.is_set():
                    if count:
                        raise DeadlineExceeded(f"--timeout passed after {reports} of {count} reports")
                    break
            stop.wait(interval)
    finally:
        if view is not None:
            view.stop()
    if not answered:
        _none_answered(nsqd, lookupd_errors, down)
    return 0


def _refuse_usage(interval: float, request_timeout: float, as_json: bool, live, topic, channel) -> None:
    if interval <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--interval'")
    if request_timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--http-client-request-timeout'")
    if as_json and live:
        raise click.UsageError("--json and --live cannot be used together")
    if channel and not topic:
        raise click.UsageError("--channel needs --topic")


def _live(app, live, as_json: bool) -> bool:
    """--live/--no-live, else a terminal on stdout without --json; rows where rich cannot draw
    (said only when --live was asked for)."""
    asked_live = live
    live = sys.stdout.isatty() and not as_json if live is None else live
    if live:
        from rich import get_console

        from ..views import cannot_draw_live

        why = cannot_draw_live(get_console())
        if why:  # rich would show a blank screen until the end: the plain rows instead
            if asked_live:
                app.warn(f"--live: no live view here ({why}): rows every --interval instead")
            live = False
    return live


def _nodes(app, nsqd: list, lookupd: list, topic, lookupd_errors: set, first: bool, request_timeout: float,
           deadline: float | None) -> list[str]:
    """This poll's nodes (see :func:`discover`); no lookupd answering the first poll once --timeout passed: exit 3."""
    from ...errors import NSQError
    from ..app import DeadlineExceeded

    try:
        return discover(app, nsqd, lookupd, topic, lookupd_errors, first=first,
                        timeout=_left(request_timeout, deadline))
    except NSQError:
        if deadline is not None and time.monotonic() >= deadline - 0.05:
            raise DeadlineExceeded(f"--timeout passed before any nsqlookupd answered "
                                   f"({', '.join(lookupd)})") from None
        raise


def _report(view, rows, sample, interval: float, as_json: bool, clients: bool, reports: int, one_channel) -> None:
    """One report: the live view, an NDJSON snapshot, or the plain rows."""
    if view is not None:
        view.update(rows, sample, interval)
    elif as_json:
        _json(rows, sample, clients)
    else:
        _plain(rows, reports, one_channel)


def _none_answered(nsqd: list, lookupd_errors: set, down: dict):
    """No node answered during the whole run: exit 1, with the port or lookupd hint."""
    from ...errors import NSQError
    from ..footguns import with_hint

    text = "no nsqd answered /stats: " + (", ".join(nsqd) or "none found through nsqlookupd")
    hinted = with_hint(text, down.values(), "nsqd")
    raise NSQError(hinted if hinted != text else with_hint(text, lookupd_errors, "nsqlookupd"))


def _left(request_timeout: float, deadline: float | None) -> float:
    """A round's deadline: --http-client-request-timeout, cut to what is left of --timeout."""
    return left(deadline, request_timeout, floor=0.05)


def _require_topic(topic: str, sample, lookupd: list, nodes: list, lookupd_errors: set) -> None:
    """At the first poll: a topic that no node that answered carries (and no lookupd that
    answered knows) is an error, as in `nsqcli lookup` - not an empty report forever."""
    from ...errors import NSQError

    if any(t.get("topic_name") == topic for st in sample.stats.values() for t in st.get("topics") or []):
        return
    if sample.stats:
        raise NSQError(f"topic {topic!r} exists on no nsqd (asked {', '.join(sorted(sample.stats))})")
    if lookupd and not nodes and len(lookupd_errors) < len(lookupd):
        raise NSQError(f"topic {topic!r} is unknown to nsqlookupd {', '.join(lookupd)}")


def _merge(last, sample):
    """Keep the newest answer of every node, so a node that was down gets rates when it is back."""
    if last is None:
        return sample
    last.stats.update(sample.stats)
    last.taken.update(sample.taken)
    last.down = dict(sample.down)
    return last


def _plain(rows, n: int, single: bool) -> None:
    """Fixed-width rows (nsq_stat's layout), the name column as wide as the longest name: a
    topic/channel@node is never cut."""
    if not rows:
        return
    names = [f"{r.topic}/{r.channel or '-'}" + (f"@{r.node}" if r.node != "*" else "") for r in rows]
    width = max([len("topic/channel")] + [len(x) for x in names]) + 1
    out = []
    if n % 25 == 1:
        out.append(HEADER if single else "topic/channel".ljust(width) + HEADER.replace("\n", "\n" + " " * width))
    for name, r in zip(names, rows):
        line = ROW.format(r.ingress, r.egress, r.depth, r.mem, r.backend_depth, r.in_flight, r.deferred,
                          r.requeued, r.timed_out, r.messages, r.clients)
        if r.paused:
            line += " paused"
        if not single:
            line = name.ljust(width) + line
        out.append(line)
    from ..app import write_stdout

    write_stdout("\n".join(out) + "\n")


def _json(rows, sample, clients: bool) -> None:
    doc = {"time": time.time(), "nodes_up": sorted(sample.stats), "nodes_down": sample.down,
           "rows": [dict(r.to_json(), **({"clients": r.client_list} if clients else {})) for r in rows]}
    from ..app import write_stdout

    write_stdout(json.dumps(doc, sort_keys=True) + "\n")


class _LiveView:
    """The dashboard on the terminal (stdout), refitted to the terminal's width and height at
    each sample (the rows that fit and "+N more": the title never scrolls away)."""

    def __init__(self, app, clients: bool):
        from rich.live import Live

        from ..views import dashboard

        self.clients = clients
        self.render = dashboard
        self.live = Live(console=None, refresh_per_second=4, auto_refresh=False, vertical_overflow="visible")
        self.live.start()

    def update(self, rows, sample, interval) -> None:
        from ..views import live_height

        console = self.live.console
        self.live.update(self.render(rows, sample, self.clients, width=console.width, height=live_height(console)),
                         refresh=True)

    def stop(self) -> None:
        from ..views import stop_display

        stop_display(self.live.stop)
