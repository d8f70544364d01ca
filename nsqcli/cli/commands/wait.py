"""``nsqcli wait``: block until conditions on the cluster hold - the CI gate that replaces a
``stat --json | jq`` sleep loop. Every --interval the given nsqd/nsqlookupd are asked at once
(/ping for --ready, /stats for the rest); exit 0 as soon as every condition holds, 1 as soon
as a --fail-on-* counter rises, 3 when --timeout passes first (naming what was not met)."""

from __future__ import annotations

import time

import click

from ..command import command, option
from ..options import check_timeout, deadline_of, http_tls_options, setup_http_tls, topic_arguments
from ..types import DURATION, HTTP_ADDRESS
from ...clock import left

#: after this long without every condition holding, say once what is still awaited (then every REMIND)
FIRST_SAY, REMIND = 5.0, 30.0


@command(examples="""
nsqcli wait --ready --nsqd-http-address 127.0.0.1:4151 --lookupd-http-address 127.0.0.1:4161
nsqcli wait orders --exists                          # until some nsqd has the topic
nsqcli wait orders billing --drained --fail-on-requeue --timeout 2m
nsqcli wait orders billing --depth-below 1000        # backlog under 1000 (summed over nodes)
nsqcli wait --ready && nsqcli pub orders 'smoke' && nsqcli wait orders billing --drained
""")
@topic_arguments(required=False, channel=True, topic_help="The topic the conditions are about (or the first argument).",
                 channel_help="The channel the conditions are about")
@option("--ready", is_flag=True, help="Every given nsqd and nsqlookupd answers /ping with OK.")
@option("--exists", "--topic-exists", "exists", is_flag=True,
        help="The topic (and the channel, if given) exists on some nsqd.")
@option("--drained", is_flag=True,
        help="depth, in-flight and deferred are 0 on every nsqd carrying the channel (without a channel: "
             "the topic's depth and all its channels), on two looks in a row. A channel that exists "
             "nowhere is not drained.")
@option("--depth-below", type=click.IntRange(1), metavar="N",
        help="The channel's depth (without a channel: the topic's), summed over the nodes, is below N.")
@option("--fail-on-requeue", is_flag=True,
        help="Exit 1 as soon as the channel's requeue_count (without a channel: any channel of the topic) "
             "rises above what it was at the start.")
@option("--fail-on-timeout", is_flag=True,
        help="Exit 1 as soon as the channel's timeout_count rises above what it was at the start.")
@option("--nsqd-http-address", "nsqd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS",
        show_envvar=True, help="nsqd HTTP address (repeatable). Default 127.0.0.1:4151 when no lookupd is given.")
@option("--lookupd-http-address", "lookupd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_LOOKUPD_HTTP_ADDRESS",
        show_envvar=True, help="nsqlookupd HTTP address (repeatable): the nodes carrying the topic are "
                               "found through it every --interval.")
@option("--interval", type=DURATION, default="0.25s", show_default=True, help="How often to look.")
@option("--http-client-request-timeout", "request_timeout", type=DURATION, default="2s", show_default=True,
        help="How long each look waits for the nodes' answers; a node silent for longer has not answered "
             "(its conditions are not met).")
@option("--timeout", type=DURATION, default="60s", show_default=True,
        help="Give up then, counted from the start: exit 3 naming each condition not met.")
@http_tls_options
@click.pass_obj
def wait(app, topic, channel, ready, exists, drained, depth_below, fail_on_requeue, fail_on_timeout, nsqd,
         lookupd, interval, request_timeout, timeout, **tls):
    """Wait until every condition given holds (they combine: all must hold), then exit 0.

    Exit 1 at once when --fail-on-requeue/--fail-on-timeout see the counter rise (a poison
    message is seen at its first REQ, not when --timeout passes; a REQ before the wait's first
    look is part of its baseline, so start the wait before the work, or see nsqd's count with
    `nsqcli check --requeues-crit 0`); exit 3 when --timeout passes
    first, with one line naming what was not met and the numbers last seen. A node that does not
    answer holds up --ready and --drained (it may carry the channel) but not --exists.
    Nothing is written on stdout.
    """
    from ..app import DeadlineExceeded
    from ..signals import GracefulStop
    from ...errors import NSQError

    if interval <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--interval'")
    if request_timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--http-client-request-timeout'")
    check_timeout(timeout, endless=False)
    if not (ready or exists or drained or depth_below):
        raise click.UsageError("nothing to wait for: give --ready, --exists, --drained or --depth-below")
    for flag, on in (("--exists", exists), ("--drained", drained), ("--depth-below", depth_below),
                     ("--fail-on-requeue", fail_on_requeue), ("--fail-on-timeout", fail_on_timeout)):
        if on and not topic:
            raise click.UsageError(f"{flag} needs a TOPIC (nsqcli wait TOPIC [CHANNEL] {flag} ...)")
    setup_http_tls(tls)
    deadline = deadline_of(timeout)
    nsqd, lookupd = list(nsqd), list(lookupd)
    if not nsqd and not lookupd:
        nsqd = ["127.0.0.1:4151"]
    stopper = GracefulStop().install()  # a signal: exit 130/143 (during a request too: nothing to settle)
    gate = Gate(topic, channel, exists, drained, depth_below, fail_on_requeue, fail_on_timeout)
    t0 = time.monotonic()
    said_at = None
    # --drained holds twice, an interval apart, before it is said: a message nsqd has taken from
    # the channel's queue for a client but not yet put in flight (or back from deferred, not yet
    # in the queue) is in none of the counts for that moment. A consumer REQing each delivery
    # looked drained once under load (CI68), and the gate passed.
    met_once = False

    def look() -> list[str]:
        unmet = _pings(nsqd, lookupd, left(deadline, request_timeout, floor=0.05)) if ready else []
        if gate.needs_stats:
            unmet += gate.look(nsqd, lookupd, left(deadline, request_timeout, floor=0.05))
        return unmet

    while True:
        unmet = stopper.call(look, "nsqcli-wait")
        if gate.failed:
            raise NSQError(gate.failed)
        now = time.monotonic()
        if not unmet and (met_once or not gate.drained):
            app.info(f"ready after {now - t0:.1f}s: {gate.describe(ready)}")
            return 0
        met_once = not unmet
        if not met_once and deadline is not None and now + 0.01 >= deadline:
            raise DeadlineExceeded(f"--timeout ({timeout:g}s) passed; not met: {'; '.join(unmet)}")
        if unmet and (said_at is None and now - t0 >= FIRST_SAY or said_at is not None and now - said_at >= REMIND):
            said_at = now
            app.info(f"waiting ({now - t0:.0f}s): {'; '.join(unmet)}")
        stopper.pause(left(deadline, interval, floor=0.0))


def _why(error) -> str:
    """An HTTP helper's error without its leading URL (the node is named already)."""
    text = str(error)
    return text.split(": ", 1)[1] if text.startswith(("http://", "https://")) and ": " in text else text


def _pings(nsqd: list[str], lookupd: list[str], timeout: float) -> list[str]:
    """The not-ready nodes, each as '<kind> ADDRESS not ready: why'."""
    from ...client.http import ask_http, http_get
    from ...errors import LookupdError

    def ping(address):
        status, _, body = http_get(address, "/ping", timeout=timeout)
        if status != 200:
            text = body.decode("utf-8", "replace").strip()[:100]
            raise LookupdError(f"/ping answered HTTP {status}{': ' + text if text else ''}", address, status)
        return True

    kinds = [("nsqd", a) for a in nsqd] + [("nsqlookupd", a) for a in lookupd]
    answers = ask_http([a for _, a in kinds], ping, timeout)
    return [f"{kind} {address} not ready ({_why(a.error)})" for (kind, address), a in zip(kinds, answers) if not a.ok]


class Gate:
    """The /stats conditions of one run, and the --fail-on-* baselines (per node and channel:
    a channel first seen on a node that answered before counts from 0; a counter that went down
    - nsqd restarted - counts from 0 again)."""

    def __init__(self, topic, channel, exists, drained, depth_below, fail_on_requeue, fail_on_timeout):
        from ...client.stats import Poller

        self.topic, self.channel = topic, channel
        self.exists, self.drained, self.depth_below = exists, drained, depth_below
        self.counters = [k for k, on in (("requeue_count", fail_on_requeue), ("timeout_count", fail_on_timeout)) if on]
        self.needs_stats = bool(exists or drained or depth_below or self.counters)
        self.name = f"{topic}/{channel}" if channel else str(topic)
        self.poller = Poller(topic, channel, clients=False)
        self.base: dict[tuple, int] = {}     # (node, channel, counter) -> its value at the start
        self.seen_nodes: set[str] = set()
        self.failed = ""

    def describe(self, ready: bool) -> str:
        parts = ["every node answered /ping"] if ready else []
        if self.exists:
            parts.append(f"{'channel' if self.channel else 'topic'} {self.name} exists")
        if self.drained:
            parts.append(f"{self.name} drained")
        if self.depth_below:
            parts.append(f"{self.name} depth below {self.depth_below}")
        return ", ".join(parts)

    def nodes(self, nsqd: list[str], lookupd: list[str], timeout: float) -> tuple[list[str], list[str]]:
        """(nsqd HTTP addresses to ask, what kept the lookupds from answering)."""
        if not lookupd:
            return nsqd, []
        from ...client.http import cluster_view

        view = cluster_view(lookupd, self.topic, timeout)
        given = {a.split("://", 1)[-1].rstrip("/") for a in nsqd}
        found = sorted(n.http_address for n in view.producers(self.topic) if n.http_address not in given)
        return list(nsqd) + found, [f"nsqlookupd did not answer ({e})" for e in view.errors]

    def look(self, nsqd: list[str], lookupd: list[str], timeout: float) -> list[str]:
        """Ask, check the --fail-on-* counters (``failed`` says why), return what is not met."""
        end = time.monotonic() + timeout
        nodes, unmet = self.nodes(nsqd, lookupd, timeout)
        sample = self.poller.poll(nodes, max(0.05, end - time.monotonic())) if nodes else None
        stats = sample.stats if sample else {}
        down = sample.down if sample else {}
        carrying = {}  # node -> (topic stats, [channel stats])
        for node, st in stats.items():
            for t in st.get("topics") or []:
                if t.get("topic_name") != self.topic:
                    continue
                chans = [c for c in t.get("channels") or [] if not self.channel or c.get("channel_name") == self.channel]
                if self.channel and not chans:
                    continue
                carrying[node] = (t, chans)
        self._counters(carrying)
        self.seen_nodes.update(stats)
        where = f"asked {', '.join(sorted(stats))}" if stats else "no nsqd answered"
        if not carrying:
            missing = f"{'channel' if self.channel else 'topic'} {self.name} exists on no nsqd ({where})"
            if lookupd and not nodes and not unmet:
                missing = f"topic {self.topic} is not registered with nsqlookupd {', '.join(lookupd)}"
            if self.exists or self.drained or self.depth_below:
                unmet.append(missing)
            unmet += [f"nsqd {n} did not answer ({_why(e)})" for n, e in sorted(down.items())]
            return unmet
        silent = [f"nsqd {n} did not answer ({_why(e)})" for n, e in sorted(down.items())]
        if self.drained:
            depth = sum(c["depth"] for _, cs in carrying.values() for c in cs)
            if not self.channel:
                depth += sum(t["depth"] for t, _ in carrying.values())
            in_flight = sum(c["in_flight_count"] for _, cs in carrying.values() for c in cs)
            deferred = sum(c["deferred_count"] for _, cs in carrying.values() for c in cs)
            if depth or in_flight or deferred:
                unmet.append(f"{self.name} not drained: depth {depth}, in flight {in_flight}, deferred {deferred} "
                             f"(on {', '.join(sorted(carrying))})")
            unmet += silent  # a silent node may carry the channel: not known to be drained
        if self.depth_below:
            if self.channel:
                depth = sum(c["depth"] for _, cs in carrying.values() for c in cs)
            else:
                depth = sum(t["depth"] for t, _ in carrying.values())
            if depth >= self.depth_below:
                unmet.append(f"{self.name} depth {depth}, not below {self.depth_below}")
            if not self.drained:
                unmet += silent
        return unmet

    def _counters(self, carrying: dict) -> None:
        for counter in self.counters:
            rises = []
            for node, (_, chans) in carrying.items():
                for c in chans:
                    key = (node, c["channel_name"], counter)
                    cur = c.get(counter, 0)
                    if key not in self.base:
                        self.base[key] = 0 if node in self.seen_nodes else cur
                    elif cur < self.base[key]:  # nsqd restarted: every count it has came after the start
                        self.base[key] = 0
                    if cur > self.base[key]:
                        rises.append((node, c["channel_name"], self.base[key], cur))
            if rises and not self.failed:
                n = sum(cur - base for *_, base, cur in rises)
                what = "requeued" if counter == "requeue_count" else "timed out"
                detail = ", ".join(f"{self.topic}/{ch} {counter} {base} -> {cur} on nsqd {node}"
                                   for node, ch, base, cur in rises)
                self.failed = (f"{n} message{'s' if n != 1 else ''} {what} since the wait started "
                               f"(--fail-on-{'requeue' if counter == 'requeue_count' else 'timeout'}: {detail})")
