"""Topic/channel administration over nsqd's and nsqlookupd's HTTP APIs, as nsqadmin does it:
find the nodes (given, or every nsqd that lookupd says carries the topic), then apply the
action to each, returning one result per node. Deleting through lookupd deletes on the nsqd
nodes first and then in every lookupd, so a node does not re-register the topic."""

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

    def describe(self) -> str:
        what = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind} {self.address}: POST {self.path} {what}"

    def to_json(self) -> dict:
        return asdict(self)


def _short(address: str) -> str:
    return base_url(address).split("://", 1)[1]


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


def apply(steps: list[Step], timeout: float = 5.0) -> list[Step]:
    """Run the steps in order; every step is tried and gets ok/error. A step meant for an nsqd
    first checks that the address is one: nsqlookupd also answers /topic/create (and more), so
    an nsqlookupd HTTP port given as --nsqd-http-address would be 'ok' with no nsqd changed."""
    checked: dict[str, str] = {}
    for s in steps:
        try:
            if s.kind == "nsqd":
                if s.address not in checked:
                    checked[s.address] = _not_nsqd(s.address, timeout)
                if checked[s.address]:
                    s.ok, s.error = False, checked[s.address]
                    continue
            http_json(s.address, s.path, s.params, timeout, method="POST")
            s.ok = True
        except LookupdError as e:
            s.ok, s.error = False, str(e)
    return steps


def _not_nsqd(address: str, timeout: float) -> str:
    """'' when ``address`` is an nsqd's HTTP port (its /info names a tcp_port), else why not."""
    info = http_json(address, "/info", {}, timeout)
    if isinstance(info, dict) and "tcp_port" in info:
        return ""
    return (f"{address} is not an nsqd (it answered /info like nsqlookupd HTTP port: "
            "give nsqd's HTTP port, usually 4151)")
