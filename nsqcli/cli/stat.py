"""``nsqcli stat``: poll nsqd /stats on every node and show rates, depth, warnings."""

from __future__ import annotations

import json
import sys
import threading
import time

import click

from .types import CHANNEL, DURATION, HTTP_ADDRESS, TOPIC

HEADER = ("------rate------+----------------depth----------------+--------------metadata---------------\n"
          "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients")
ROW = "{:7.0f} {:7.0f} | {:7d} {:7d} {:7d} {:5d} {:5d} | {:7d} {:7d} {:12d} {:7d}"


def discover(app, nsqd: list[str], lookupd: list[str], topic: str | None) -> list[str]:
    """nsqd HTTP addresses: the given ones, or every node the lookupds know (carrying ``topic``)."""
    if nsqd:
        return nsqd
    from ..client.http import cluster_view

    view = cluster_view(lookupd, topic)
    for e in view.errors:
        app.warn(f"nsqlookupd failed: {e}")
    nodes = view.producers(topic) if topic else list(view.nodes.values())
    return sorted(n.http_address for n in nodes)


@click.command()
@click.option("-t", "--topic", type=TOPIC, help="Only this topic.")
@click.option("-c", "--channel", type=CHANNEL, help="Only this channel (with --topic).")
@click.option("--nsqd-http-address", "nsqd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS", show_envvar=True,
              help="nsqd HTTP address (repeatable). Default 127.0.0.1:4151 when no lookupd is given.")
@click.option("--lookupd-http-address", "lookupd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_LOOKUPD_HTTP_ADDRESS",
              show_envvar=True, help="Find the nsqd nodes through nsqlookupd (re-read every interval).")
@click.option("--interval", type=DURATION, default="2s", show_default=True)
@click.option("--count", type=click.IntRange(1), help="Print this many reports, then exit.")
@click.option("--per-node", is_flag=True, help="A row per node instead of summing over nodes.")
@click.option("--clients", is_flag=True, help="Also show every consumer (live view and --json).")
@click.option("--json", "as_json", is_flag=True, help="One NDJSON snapshot per interval on stdout.")
@click.option("--live/--no-live", default=None, help="Live dashboard (default: when stdout is a TTY).")
@click.pass_obj
def stat(app, topic, channel, nsqd, lookupd, interval, count, per_node, clients, as_json, live):
    """Poll nsqd /stats every --interval and report per topic/channel: ingress and egress rates,
    depth (memory/disk), in-flight, deferred, requeued, timed out, messages, clients.

    The first poll is the baseline for rates. A node that does not answer is reported down and
    polling goes on; exit 1 only if no node answered during the whole run.
    """
    from ..errors import NSQError
    from ..client.stats import compute_rows, poll_nodes

    if channel and not topic:
        raise click.UsageError("--channel needs --topic")
    nsqd, lookupd = list(nsqd), list(lookupd)
    if not nsqd and not lookupd:
        nsqd = ["127.0.0.1:4151"]
    live = sys.stdout.isatty() and not as_json if live is None else live
    stop = threading.Event()
    from .app import stop_on_signals

    stop_on_signals(stop)
    history: dict = {}
    last = None  # latest answer of every node, for rates
    reports = 0
    answered = False
    down_before: set[str] = set()
    view = _LiveView(app, clients) if live else None
    try:
        while not stop.is_set():
            nodes = discover(app, nsqd, lookupd, topic)
            sample = poll_nodes(nodes, topic, channel, clients=True)
            answered |= bool(sample.stats)
            rows = compute_rows(last, sample, per_node, history)
            for node in set(sample.down) - down_before:
                app.warn(f"nsqd {node} is down: {sample.down[node]}")
            down_before = set(sample.down)
            if last is not None or view is not None:
                reports += 1
                if view is not None:
                    view.update(rows, sample, interval)
                elif as_json:
                    _json(rows, sample, clients)
                else:
                    _plain(rows, reports, topic and channel and not per_node)
            last = _merge(last, sample)
            if count and reports >= count:
                break
            stop.wait(interval)
    finally:
        if view is not None:
            view.stop()
    if not answered:
        raise NSQError("no nsqd answered /stats: " + (", ".join(nsqd) or "none found through nsqlookupd"))
    return 0


def _merge(last, sample):
    """Keep the newest answer of every node, so a node that was down gets rates when it is back."""
    if last is None:
        return sample
    last.stats.update(sample.stats)
    last.taken.update(sample.taken)
    last.down = dict(sample.down)
    return last


def _plain(rows, n: int, single: bool) -> None:
    if not rows:
        return
    out = []
    if n % 25 == 1:
        out.append(HEADER if single else "topic/channel" + " " * 27 + HEADER.replace("\n", "\n" + " " * 40))
    for r in rows:
        line = ROW.format(r.ingress, r.egress, r.depth, r.mem, r.backend_depth, r.in_flight, r.deferred,
                          r.requeued, r.timed_out, r.messages, r.clients)
        if r.paused:
            line += " paused"
        if not single:
            name = f"{r.topic}/{r.channel or '-'}" + (f"@{r.node}" if r.node != "*" else "")
            line = f"{name[:39]:39s} {line}"
        out.append(line)
    from .app import write_stdout

    write_stdout("\n".join(out) + "\n")


def _json(rows, sample, clients: bool) -> None:
    doc = {"time": time.time(), "nodes_up": sorted(sample.stats), "nodes_down": sample.down,
           "rows": [dict(r.to_json(), **({"clients": r.client_list} if clients else {})) for r in rows]}
    from .app import write_stdout

    write_stdout(json.dumps(doc, sort_keys=True) + "\n")


class _LiveView:
    def __init__(self, app, clients: bool):
        from rich.live import Live

        from .views import dashboard

        self.clients = clients
        self.render = dashboard
        self.live = Live(console=None, refresh_per_second=4, auto_refresh=False)
        self.live.start()

    def update(self, rows, sample, interval) -> None:
        self.live.update(self.render(rows, sample, self.clients), refresh=True)

    def stop(self) -> None:
        self.live.stop()
