"""Topic/channel administration over nsqd's and nsqlookupd's HTTP APIs, as nsqadmin does it:
find the nodes (given, or every nsqd that lookupd says carries the topic), then apply the
action to every node at once, returning one result per node. Deleting through lookupd deletes
on the nsqd nodes first and then in every lookupd, so a node does not re-register the topic -
and only if every nsqd delete succeeded, so no node is left holding messages no consumer finds."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import LookupdError
from .http import base_url, cluster_view, http_json

#: actions that destroy messages or registrations (confirmation needed)
DESTRUCTIVE = {"delete", "empty", "tombstone"}


@dataclass
class Step:
    kind: str          # "nsqd" or "nsqlookupd"
    address: str       # its HTTP address
    path: str          # e.g. /topic/delete
    params: dict
    ok: bool | None = None
    error: str = ""
    skipped: bool = False  # not run (ok stays None): see apply

    def describe(self) -> str:
        what = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind} {self.address}: POST {self.path} {what}"

    def to_json(self) -> dict:
        return asdict(self)


def _short(address: str) -> str:
    """'http://h:p/x' -> 'h:p'; an https:// address keeps its scheme (it is asked over TLS)."""
    url = base_url(address)
    return url if url.startswith("https://") else url.split("://", 1)[1]


def plan(action: str, topic: str, channel: str | None, nsqd: list[str], lookupd: list[str],
         node: str | None = None, timeout: float = 5.0) -> tuple[list[Step], list[str]]:
    """The HTTP calls that carry out ``action`` (create, delete, pause, unpause, empty,
    tombstone), in order. Returns (steps, warnings)."""
    warnings: list[str] = []
    kind = "channel" if channel else "topic"
    params = {"topic": topic, **({"channel": channel} if channel else {})}
    nodes = [_short(a) for a in nsqd]
    view = None
    if lookupd:
        view = cluster_view(lookupd, topic, timeout)
        warnings += [f"nsqlookupd failed: {e}" for e in view.errors]
        if not view.answered:
            raise LookupdError("no nsqlookupd answered (" + "; ".join(str(e) for e in view.errors) + ")",
                               ", ".join(lookupd))
        if not nsqd:
            nodes = sorted(n.http_address for n in view.producers(topic))
    if action == "tombstone":
        if not lookupd:
            raise ValueError("tombstoning is done in nsqlookupd: give --lookupd-http-address")
        target = _node_http_address(node or "", view)
        return [Step("nsqlookupd", _short(a), "/topic/tombstone", {"topic": topic, "node": target})
                for a in view.answered], warnings
    steps = [Step("nsqd", n, f"/{kind}/{action}", dict(params)) for n in nodes]
    if lookupd and action in ("create", "delete"):
        # create: lookupd knows the topic/channel before any node has it (nsqadmin does this);
        # delete: after the nodes, so that none registers it again
        steps += [Step("nsqlookupd", _short(a), f"/{kind}/{action}", dict(params)) for a in view.answered]
    if not steps:
        where = "no nsqd carries it according to nsqlookupd" if lookupd else "no nsqd address was given"
        raise LookupdError(f"nothing to do for {kind} {topic}{'/' + channel if channel else ''}: {where}",
                           ", ".join(lookupd or nsqd) or "-")
    return steps, warnings


def _node_http_address(node: str, view) -> str:
    """'host:tcp_port' or 'host:http_port' of a registered node -> its 'broadcast:http_port'."""
    for n in view.nodes.values():
        if node in (n.tcp_address, n.http_address, n.hostname):
            return n.http_address
    known = ", ".join(sorted(n.http_address for n in view.nodes.values())) or "none"
    raise ValueError(f"node {node!r} is not registered with nsqlookupd (nodes: {known})")


def apply(steps: list[Step], timeout: float = 5.0, deadline: float | None = None) -> list[Step]:
    """Run the steps: every nsqd step at once, then every nsqlookupd step at once, each node
    under its own deadline (``timeout`` per request: a hung node costs one round, not one per
    node). Every step gets ok/error, or ``skipped``: a delete that failed on any nsqd leaves
    nsqlookupd as it was - deleted there, the topic (or channel) would vanish from discovery
    while the node that did not answer still holds it and its messages, found by no consumer.

    A step meant for an nsqd first checks that the address is one: nsqlookupd also answers
    /topic/create (and more), so an nsqlookupd HTTP port given as --nsqd-http-address would
    be 'ok' with no nsqd changed.

    ``deadline`` (time.monotonic()): the whole of it ends by then - every request is cut to the
    time left, and steps not started by then are ``skipped`` ("not run: --timeout passed")."""
    nsqd = [s for s in steps if s.kind == "nsqd"]
    lookupd = [s for s in steps if s.kind != "nsqd"]
    _run_at_once(nsqd, timeout, deadline)
    failed = [s.address for s in nsqd if not s.ok]
    if failed and any(s.path.endswith("/delete") for s in lookupd):
        for s in lookupd:
            s.skipped, s.error = True, f"not run: the delete failed on nsqd {', '.join(failed)}"
        return steps
    _run_at_once(lookupd, timeout, deadline)
    return steps


def _run_at_once(steps: list[Step], timeout: float, deadline: float | None = None) -> None:
    import time

    from .fanout import ask_all

    if not steps:
        return
    end = time.monotonic() + 2 * timeout
    if deadline is not None:
        if deadline - time.monotonic() <= 0:
            for s in steps:
                s.skipped, s.error = True, "not run: --timeout passed"
            return
        end = min(end, deadline)
    answers = ask_all(steps, lambda s: _run(s, timeout, end), max(0.0, end - time.monotonic()),
                      catch=LookupdError, name=lambda s: base_url(s.address), slack=0.1)
    for s, a in zip(steps, answers):
        s.error = a.value if a.ok else str(a.error)
        s.ok = not s.error


def _run(step: Step, timeout: float, end: float) -> str:
    """One step (an nsqd's /info check first): '' when done, else why it was not done (or
    LookupdError). Each request within ``timeout``, both by ``end`` (time.monotonic())."""
    import time

    if step.kind == "nsqd":
        why = _not_nsqd(step.address, min(timeout, max(0.001, end - time.monotonic())))
        if why:
            return why
    left = min(timeout, end - time.monotonic())
    if left <= 0:
        raise LookupdError("not sent: no time was left after the /info check", base_url(step.address))
    http_json(step.address, step.path, step.params, left, method="POST")
    return ""


def _not_nsqd(address: str, timeout: float) -> str:
    """'' when ``address`` is an nsqd's HTTP port (its /info names a tcp_port), else why not."""
    info = http_json(address, "/info", {}, timeout)
    if isinstance(info, dict) and "tcp_port" in info:
        return ""
    return (f"{address} is not an nsqd (it answered /info like nsqlookupd HTTP port: "
            "give nsqd's HTTP port, usually 4151)")
