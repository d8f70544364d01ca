"""``nsqcli check``: one look at the cluster against thresholds, for monitoring (like
``nats server check``): Nagios plugin output and exit codes, Prometheus text, JSON or text.

Every value is what nsqd's /stats says at the moment of the check, summed over the nodes per
topic/channel: depth, in-flight, deferred, and requeue_count/timeout_count - the counts since
the channel was created on that nsqd (or nsqd started), not a rate. The age of the oldest
message is not in /stats (nsqd keeps no timestamp of its queue's head), so there is no age
threshold: `nsqcli tail --peek` shows the oldest messages themselves."""

from __future__ import annotations

import json
import time
import urllib.parse

import click

from ..command import command, option
from ..options import check_timeout, deadline_of, http_tls_options, setup_http_tls, topic_arguments
from ..types import DURATION, HTTP_ADDRESS
from ...clock import left

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
NAMES = ("OK", "WARNING", "CRITICAL", "UNKNOWN")
FORMATS = ("nagios", "prometheus", "json", "text")
#: metric -> (Row attribute, words in a problem, rows it applies to: "all" or "channel")
METRICS = {"depth": ("depth", "depth", "all"), "in_flight": ("in_flight", "in flight", "channel"),
           "requeues": ("requeued", "requeued", "channel"), "timeouts": ("timed_out", "timed out", "channel")}


def _thresholds(f):
    for metric, words in (("timeouts", "timeout_count"), ("requeues", "requeue_count"),
                          ("in-flight", "in-flight messages"), ("depth", "depth (memory + disk)")):
        f = option(f"--{metric}-crit", type=click.IntRange(0), metavar="N",
                   help=f"CRITICAL when a channel's {words} is above N.")(f)
        f = option(f"--{metric}-warn", type=click.IntRange(0), metavar="N",
                   help=f"WARNING when a channel's {words} is above N.")(f)
    return f


@command(examples="""
nsqcli check --depth-warn 1000 --depth-crit 10000              # Nagios/Icinga: NSQ OK - ... | perfdata
nsqcli check orders billing --clients-min 1 --requeues-warn 100 --lookupd-http-address 127.0.0.1:4161
nsqcli check --format prometheus > /var/lib/node_exporter/nsq.prom.$$ ; mv /var/lib/node_exporter/nsq.prom.$$ /var/lib/node_exporter/nsq.prom
nsqcli check --format json | jq '.problems[]'
""")
@topic_arguments(required=False, channel=True, topic_help="Only this topic (or the first argument).",
                 channel_help="Only this channel (with a topic)")
@_thresholds
@option("--clients-min", type=click.IntRange(0), metavar="N",
        help="CRITICAL when a channel has fewer than N consumers connected (summed over the nodes).")
@option("--format", "fmt", type=click.Choice(FORMATS), default="nagios", show_default=True,
        help="nagios: one line 'NSQ STATUS - ... | perfdata'; prometheus: text exposition; json; text.")
@option("--nsqd-http-address", "nsqd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS",
        show_envvar=True, help="nsqd HTTP address (repeatable). Default 127.0.0.1:4151 when no lookupd is given.")
@option("--lookupd-http-address", "lookupd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_LOOKUPD_HTTP_ADDRESS",
        show_envvar=True, help="Check every nsqd registered with nsqlookupd (with a topic: those carrying it).")
@option("--http-client-request-timeout", "request_timeout", type=DURATION, default="5s", show_default=True,
        help="How long the nodes (asked at once) may take to answer; a node silent for longer is down.")
@option("--timeout", type=DURATION, default=None,
        help="The whole check's deadline, counted from the start; UNKNOWN (3) if nothing answered by then.")
@http_tls_options
@click.pass_obj
def check(app, topic, channel, fmt, nsqd, lookupd, request_timeout, timeout, clients_min, **kw):
    """Check the nodes and every topic/channel against the thresholds; print the result in
    --format and exit with the Nagios code: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.

    A threshold is crossed when the value is ABOVE it (Nagios ranges: warn 100 alerts at 101).
    An nsqd or nsqlookupd that does not answer is CRITICAL; a topic or channel given that exists
    on no nsqd is CRITICAL; when nothing answered at all the state is UNKNOWN. Values are
    summed over the nodes. requeues/timeouts are nsqd's counts since the channel was created
    on each node (nsqd's /stats), not rates: alert on their growth with --format prometheus
    (rate()) or compare two checks. There is no message-age threshold: /stats does not say how
    old the oldest message is.

    The exit code is the same whatever the --format (a textfile cron job: `... || true`). A
    usage error exits 2 as everywhere in nsqcli.
    """
    tls = {k: v for k, v in kw.items() if k.startswith("tls_")}
    limits = {}
    for metric in METRICS:
        warn, crit = kw.get(f"{metric}_warn"), kw.get(f"{metric}_crit")
        flag = metric.replace("_", "-")
        if warn is not None and crit is not None and warn > crit:
            raise click.UsageError(f"--{flag}-warn {warn} is above --{flag}-crit {crit}")
        limits[metric] = (warn, crit)
    if channel and not topic:
        raise click.UsageError("--channel needs --topic")
    if request_timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--http-client-request-timeout'")
    check_timeout(timeout)
    setup_http_tls(tls)
    deadline = deadline_of(timeout)
    nsqd, lookupd = list(nsqd), list(lookupd)
    if not nsqd and not lookupd:
        nsqd = ["127.0.0.1:4151"]
    from ..app import write_stdout
    from ..signals import GracefulStop

    stopper = GracefulStop().install()  # a signal during the requests: exit 130/143
    result = stopper.call(lambda: run_check(topic, channel, nsqd, lookupd, limits, clients_min, request_timeout,
                                            deadline), "nsqcli-check")

    write_stdout({"nagios": nagios, "prometheus": prometheus, "json": as_json, "text": text}[fmt](result))
    return result.status


class Result:
    def __init__(self, limits: dict, clients_min):
        self.limits, self.clients_min = limits, clients_min
        self.problems: list[tuple[int, str, dict]] = []   # (severity, text, details)
        self.rows = []            # aggregated Rows (nsqcli.client.stats)
        self.node_rows = []       # per-node Rows
        self.topic_depth: dict[tuple, int] = {}  # (node, topic) -> the topic's own depth
        self.nodes_up: list[str] = []
        self.nodes_down: dict[str, str] = {}
        self.lookupd_up: list[str] = []
        self.lookupd_down: dict[str, str] = {}
        self.unknown = ""

    def add(self, severity: int, text: str, **details) -> None:
        self.problems.append((severity, text, details))

    @property
    def status(self) -> int:
        if self.unknown:
            return UNKNOWN
        return max([OK] + [s for s, _, _ in self.problems])

    def summary(self) -> str:
        if self.unknown:
            return self.unknown
        worst = sorted(self.problems, key=lambda p: -p[0])
        if worst:
            return "; ".join(t for _, t, _ in worst)
        chans = [r for r in self.rows if r.channel]
        return (f"{len(self.nodes_up)} nsqd up, {len(chans)} channel{'s' if len(chans) != 1 else ''}, "
                f"depth {sum(r.depth for r in self.rows)}, in flight {sum(r.in_flight for r in chans)}, "
                f"requeued {sum(r.requeued for r in chans)}, timed out {sum(r.timed_out for r in chans)}")


def run_check(topic, channel, nsqd, lookupd, limits, clients_min, request_timeout, deadline) -> Result:
    from ...client.stats import compute_rows, poll_nodes

    res = Result(limits, clients_min)
    end = time.monotonic() + left(deadline, request_timeout, floor=0.05)
    nodes = list(nsqd)
    if lookupd:
        nodes += _lookupd_nodes(res, topic, nsqd, lookupd, end)
        if res.unknown:
            return res
    if not nodes:
        if topic:
            res.add(CRITICAL, f"topic {topic} is registered by no nsqd (nsqlookupd {', '.join(lookupd)})")
        else:
            res.unknown = f"no nsqd is registered with nsqlookupd {', '.join(lookupd)}"
        return res
    sample = poll_nodes(nodes, topic, channel, clients=True, timeout=max(0.05, end - time.monotonic()))
    res.nodes_up, res.nodes_down = sorted(sample.stats), dict(sample.down)
    if not sample.stats:
        late = deadline is not None and time.monotonic() >= deadline - 0.05
        res.unknown = (("--timeout passed before any nsqd answered: " if late else "no nsqd answered: ")
                       + "; ".join(f"{n}: {why(e)}" for n, e in sorted(sample.down.items())))
        return res
    for node, error in sorted(sample.down.items()):
        res.add(CRITICAL, f"nsqd {node} down: {why(error)}", node=node)
    res.node_rows = compute_rows(None, sample, per_node=True)
    res.rows = compute_rows(None, sample)
    for node, st in sample.stats.items():
        for t in st.get("topics") or []:
            if not topic or t.get("topic_name") == topic:
                res.topic_depth[(node, t["topic_name"])] = t.get("depth", 0)
    if topic and not any(t == topic for _, t in res.topic_depth):
        res.add(CRITICAL, f"topic {topic} exists on no nsqd (asked {', '.join(res.nodes_up)})")
    elif channel and not any(r.channel == channel for r in res.rows):
        res.add(CRITICAL, f"channel {topic}/{channel} exists on no nsqd (asked {', '.join(res.nodes_up)})")
    _over_limits(res, limits, clients_min)
    return res


def _lookupd_nodes(res: Result, topic, nsqd, lookupd, end: float) -> list[str]:
    """The nsqd HTTP addresses nsqlookupd knows (carrying ``topic``), not given already; a lookupd
    down is CRITICAL; none answering and no nsqd given: UNKNOWN (``res.unknown``)."""
    from ...client.http import cluster_view

    view = cluster_view(lookupd, topic, max(0.05, end - time.monotonic()))
    res.lookupd_up = list(view.answered)
    for e in view.errors:
        address = urllib.parse.urlsplit(e.endpoint).netloc or e.endpoint
        res.lookupd_down[address] = why(e)
        res.add(CRITICAL, f"nsqlookupd {address} down: {why(e)}")
    given = {a.split("://", 1)[-1].rstrip("/") for a in nsqd}
    found = view.producers(topic) if topic else list(view.nodes.values())
    if not view.answered and not nsqd:
        res.unknown = f"no nsqlookupd answered ({'; '.join(str(e) for e in view.errors)})"
    return sorted(n.http_address for n in found if n.http_address not in given)


def _over_limits(res: Result, limits: dict, clients_min) -> None:
    """Every row against the --warning/--critical limits of METRICS and --clients-min."""
    for r in res.rows:
        name = f"{r.topic}/{r.channel}" if r.channel else r.topic
        for metric, (attr, words, scope) in METRICS.items():
            if scope == "channel" and not r.channel:
                continue
            warn, crit = limits[metric]
            value = getattr(r, attr)
            for severity, limit in ((CRITICAL, crit), (WARNING, warn)):
                if limit is not None and value > limit:
                    res.add(severity, f"{name} {words} {value} > {limit}", topic=r.topic, channel=r.channel,
                            metric=metric, value=value, threshold=limit)
                    break
        if clients_min is not None and r.channel and r.clients < clients_min:
            res.add(CRITICAL, f"{name} has {r.clients} client{'s' if r.clients != 1 else ''} < {clients_min}",
                    topic=r.topic, channel=r.channel, metric="clients", value=r.clients, threshold=clients_min)


def _perf(label: str, value, warn="", crit="", uom="") -> str:
    return f"'{label}'={value}{uom};{'' if warn is None else warn};{'' if crit is None else crit};0"


def nagios(res: Result) -> str:
    perf = [_perf("nodes_up", len(res.nodes_up)), _perf("nodes_down", len(res.nodes_down), crit=0)]
    for r in res.rows:
        name = f"{r.topic}/{r.channel}" if r.channel else r.topic
        perf.append(_perf(f"{name} depth", r.depth, *res.limits["depth"]))
        if r.channel:
            perf.append(_perf(f"{name} in_flight", r.in_flight, *res.limits["in_flight"]))
            perf.append(_perf(f"{name} deferred", r.deferred))
            perf.append(_perf(f"{name} requeued", r.requeued, *res.limits["requeues"], uom="c"))
            perf.append(_perf(f"{name} timed_out", r.timed_out, *res.limits["timeouts"], uom="c"))
            mn = res.clients_min
            perf.append(_perf(f"{name} clients", r.clients, crit=f"{mn}:" if mn is not None else ""))
    line = f"NSQ {NAMES[res.status]} - {res.summary()}"
    return " ".join(line.split()) + (" | " + " ".join(perf) if not res.unknown else "") + "\n"


def as_json(res: Result) -> str:
    severity = {WARNING: "warning", CRITICAL: "critical"}
    doc = {"status": NAMES[res.status], "code": res.status, "summary": res.summary(),
           "problems": [{"severity": severity[s], "text": t, **d} for s, t, d in res.problems],
           "nodes": {"up": res.nodes_up, "down": res.nodes_down},
           "lookupd": {"up": res.lookupd_up, "down": res.lookupd_down},
           "thresholds": {**{f"{m}_{k}": v for m, (w, c) in res.limits.items() for k, v in (("warn", w), ("crit", c))},
                          "clients_min": res.clients_min},
           "channels": [{k: v for k, v in r.to_json().items()
                         if not k.endswith("_per_s") and k not in ("drain_seconds", "warnings", "node")}
                        for r in res.rows]}
    return json.dumps(doc, sort_keys=True) + "\n"


def text(res: Result) -> str:
    out = [f"NSQ {NAMES[res.status]}: {res.summary() if not res.problems else len(res.problems)} "
           f"{'problem' + ('s' if len(res.problems) != 1 else '') if res.problems else ''}".rstrip()]
    for s, t, _ in sorted(res.problems, key=lambda p: -p[0]):
        out.append(f"  {NAMES[s]:<8} {t}")
    if res.rows:
        names = [f"{r.topic}/{r.channel or '-'}" for r in res.rows]
        w = max(len(n) for n in names + ["topic/channel"])
        out.append(f"{'topic/channel':<{w}}  {'depth':>8} {'in-flight':>9} {'deferred':>8} {'requeued':>8} "
                   f"{'timed-out':>9} {'clients':>7}")
        for n, r in zip(names, res.rows):
            out.append(f"{n:<{w}}  {r.depth:>8} {r.in_flight:>9} {r.deferred:>8} {r.requeued:>8} "
                       f"{r.timed_out:>9} {r.clients:>7}")
    return "\n".join(out) + "\n"


def prometheus(res: Result) -> str:
    from ...daemon.metrics import _load_prometheus_client

    _load_prometheus_client()
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import generate_latest

    fams = []
    status = GaugeMetricFamily("nsq_check_status", "nsqcli check: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN")
    status.add_metric([], res.status)
    fams.append(status)
    problems = GaugeMetricFamily("nsq_check_problems", "Thresholds crossed and nodes down, by severity",
                                 labels=["severity"])
    for s in (WARNING, CRITICAL):
        problems.add_metric([NAMES[s].lower()], sum(1 for p in res.problems if p[0] == s))
    fams.append(problems)
    up = GaugeMetricFamily("nsq_up", "1 when the node answered, else 0", labels=["kind", "address"])
    for kind, ups, downs in (("nsqd", res.nodes_up, res.nodes_down), ("nsqlookupd", res.lookupd_up, res.lookupd_down)):
        for a in ups:
            up.add_metric([kind, a], 1)
        for a in downs:
            up.add_metric([kind, a], 0)
    fams.append(up)
    tdepth = GaugeMetricFamily("nsq_topic_depth", "The topic's own depth (not yet given to its channels)",
                               labels=["node", "topic"])
    for (node, t), d in sorted(res.topic_depth.items()):
        tdepth.add_metric([node, t], d)
    fams.append(tdepth)
    labels = ["node", "topic", "channel"]
    chans = [r for r in res.node_rows if r.channel]
    for name, attr, doc, cls in (
            ("nsq_channel_depth", "depth", "Messages queued (memory + disk)", GaugeMetricFamily),
            ("nsq_channel_backend_depth", "backend_depth", "Messages queued on disk", GaugeMetricFamily),
            ("nsq_channel_in_flight", "in_flight", "Messages sent and not yet answered", GaugeMetricFamily),
            ("nsq_channel_deferred", "deferred", "Messages deferred (REQ with a delay, DPUB)", GaugeMetricFamily),
            ("nsq_channel_clients", "clients", "Consumers connected", GaugeMetricFamily),
            ("nsq_channel_requeued", "requeued", "REQs (nsqd's requeue_count)", CounterMetricFamily),
            ("nsq_channel_timed_out", "timed_out", "In-flight timeouts (nsqd's timeout_count)", CounterMetricFamily),
            ("nsq_channel_messages", "messages", "Messages given to the channel", CounterMetricFamily)):
        fam = cls(name, doc, labels=labels)
        for r in chans:
            fam.add_metric([r.node, r.topic, r.channel], getattr(r, attr))
        fams.append(fam)

    class _Registry:
        def collect(self):
            return iter(fams)

    return generate_latest(_Registry()).decode()


def why(error) -> str:
    """An HTTP helper's error without its leading URL (the node is named already)."""
    text = str(error)
    if text.startswith(("http://", "https://")) and ": " in text:
        return text.split(": ", 1)[1]
    return text
