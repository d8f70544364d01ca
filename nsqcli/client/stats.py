"""nsqd /stats over time: rows per topic/channel (or per node) with rates computed from measured
elapsed time. Pure: samples in, rows out (polling lives in poll_nodes and Poller).

Fixes against nsq_stat: egress is the sum of the consumers' finish_count deltas (never
negative, unlike Δmessages − Δdepth); rates divide by the time actually measured between two
answers of a node; paused is shown; a node that does not answer is marked down and the rest
goes on.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..errors import LookupdError
from .http import ask_http, http_json

SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class Sample:
    """One poll: per node address, the /stats JSON (or the error) and when it was taken."""

    taken: dict[str, float]                  # node -> monotonic time of its answer
    stats: dict[str, dict]                   # node -> /stats JSON
    down: dict[str, str] = field(default_factory=dict)  # node -> error


def poll_nodes(nodes: list[str], topic: str | None, channel: str | None, clients: bool = True,
               timeout: float = 5.0, clock=time.monotonic) -> Sample:
    """/stats of every node at once, in one round of ``timeout``: a node that does not answer
    by then is down (its error names it), the others are in the sample."""
    return Poller(topic, channel, clients, clock).poll(nodes, timeout)


class Poller:
    """poll_nodes round after round (``nsqcli stat``). Every node is asked at once; a node
    that let a round's deadline pass (hung, not refusing) then stops holding the rounds: it is
    asked again in the background, one request at a time, and its answer - or its error -
    joins the first round after it came. So hung nodes cost the round they hang in one
    deadline, and the rounds after it the healthy nodes' answer time."""

    def __init__(self, topic: str | None, channel: str | None, clients: bool = True, clock=time.monotonic):
        self.params = {"format": "json", "include_clients": "true" if clients else "false", "include_mem": "false"}
        if topic:
            self.params["topic"] = topic
        if channel:
            self.params["channel"] = channel
        self.clock = clock
        self.slow: dict[str, str] = {}        # node -> its error, while it is asked in the background
        self.asking: dict[str, list] = {}     # node -> [its answer (value, error, hung) once in]

    def poll(self, nodes: list[str], timeout: float = 5.0) -> Sample:
        s = Sample({}, {}, {})
        nodes = list(dict.fromkeys(nodes))
        now = [n for n in nodes if n not in self.slow]
        for node, a in zip(now, ask_http(now, lambda n: self._ask(n, timeout), timeout)):
            self._take(s, node, a.value if a.ok else (None, a.error, True))
        for node in nodes:
            if node in s.stats or node in s.down:
                continue
            box = self.asking.get(node)
            if box:  # its background answer came since the last round
                del self.asking[node]
                self._take(s, node, box[0])
            else:
                s.down[node] = self.slow[node]
        for node in nodes:
            if node in self.slow and node not in self.asking:  # hung: asked again, in the background
                self.asking[node] = box = []
                threading.Thread(target=lambda n=node, b=box: b.append(self._ask(n, timeout)),
                                 name="nsqcli-stat-slow", daemon=True).start()
        return s

    def _ask(self, node: str, timeout: float) -> tuple:
        """(stats, None, False) or (None, error, whether it waited out its deadline)."""
        t0 = time.monotonic()
        try:
            stats = http_json(node, "/stats", self.params, timeout) or {}
        except LookupdError as e:
            return None, e, time.monotonic() - t0 >= 0.9 * timeout
        return (stats, self.clock()), None, False  # when this node answered: its rates use its own interval

    def _take(self, s: Sample, node: str, answer: tuple) -> None:
        value, error, hung = answer
        if error is None:
            s.stats[node], s.taken[node] = value
            self.slow.pop(node, None)
            return
        s.down[node] = str(error)
        if hung:
            self.slow[node] = str(error)
        else:
            self.slow.pop(node, None)


@dataclass
class Row:
    node: str            # "*" when aggregated over nodes
    topic: str
    channel: str         # "" for a topic without channels
    depth: int = 0
    backend_depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    requeued: int = 0
    timed_out: int = 0
    messages: int = 0
    clients: int = 0
    ready: int = 0
    paused: bool = False
    ingress: float = 0.0      # messages/s into the channel
    egress: float = 0.0       # messages/s finished by consumers
    requeue_rate: float = 0.0
    timeout_rate: float = 0.0
    nodes: int = 0
    history: list[int] = field(default_factory=list)
    client_list: list[dict] = field(default_factory=list)

    @property
    def mem(self) -> int:
        return self.depth - self.backend_depth

    @property
    def key(self) -> tuple:
        return (self.node, self.topic, self.channel)

    def drain_seconds(self) -> float | None:
        """Time until depth reaches 0 at the current rates (None: not draining)."""
        if self.depth == 0:
            return 0.0
        net = self.egress - self.ingress
        return self.depth / net if net > 0 else None

    def warnings(self) -> list[str]:
        w = []
        if self.paused:
            w.append("paused")
        if self.backend_depth > 0:
            w.append("spilling to disk")
        if self.channel and self.clients == 0 and self.depth > 0:
            w.append("no consumers")
        if self.clients and self.ready and self.in_flight >= 0.85 * self.ready:
            w.append("consumers saturated")
        if self.timeout_rate > 0:
            w.append("timeouts")
        if self.requeue_rate > 0 and self.requeue_rate >= 0.1 * max(self.egress, 1e-9):
            w.append("requeues")
        if not self.channel:
            w.append("no channels")
        return w

    def sparkline(self, width: int = 20) -> str:
        h = self.history[-width:]
        if not h:
            return ""
        top = max(h) or 1
        return "".join(SPARK[min(7, int(v * 7 / top + 0.5))] if v else " " for v in h)

    def to_json(self) -> dict:
        return {"node": self.node, "topic": self.topic, "channel": self.channel, "depth": self.depth,
                "mem": self.mem, "disk": self.backend_depth, "in_flight": self.in_flight,
                "deferred": self.deferred, "requeued": self.requeued, "timed_out": self.timed_out,
                "messages": self.messages, "clients": self.clients, "ready": self.ready,
                "paused": self.paused, "nodes": self.nodes,
                "ingress_per_s": round(self.ingress, 3), "egress_per_s": round(self.egress, 3),
                "requeue_per_s": round(self.requeue_rate, 3), "timeout_per_s": round(self.timeout_rate, 3),
                "drain_seconds": self.drain_seconds(), "warnings": self.warnings()}


def _client_key(c: dict) -> tuple:
    return (c.get("remote_address"), c.get("client_id"), c.get("connect_ts"))


def _node_rows(node: str, stats: dict) -> dict[tuple, tuple[Row, dict]]:
    """Rows of one node with, per row, the raw counters needed for deltas."""
    out = {}
    for t in stats.get("topics") or []:
        chans = t.get("channels") or []
        if not chans:
            r = Row(node, t["topic_name"], "", depth=t["depth"], backend_depth=t["backend_depth"],
                    messages=t["message_count"], paused=t.get("paused", False), nodes=1)
            out[r.key] = (r, {})
        for c in chans:
            clients = c.get("clients") or []
            r = Row(node, t["topic_name"], c["channel_name"], depth=c["depth"], backend_depth=c["backend_depth"],
                    in_flight=c["in_flight_count"], deferred=c["deferred_count"], requeued=c["requeue_count"],
                    timed_out=c["timeout_count"], messages=c["message_count"],
                    clients=c.get("client_count", len(clients)), paused=c.get("paused", False) or t.get("paused", False),
                    ready=sum(cl.get("ready_count", 0) for cl in clients), nodes=1,
                    client_list=[{**cl, "node": node} for cl in clients])
            out[r.key] = (r, {_client_key(cl): cl.get("finish_count", 0) for cl in clients})
    return out


def _rate(cur: int, prev: int, dt: float) -> float:
    return max(0, cur - prev) / dt if dt > 0 else 0.0


def compute_rows(prev: Sample | None, cur: Sample, per_node: bool = False,
                 history: dict[tuple, list[int]] | None = None, keep: int = 60) -> list[Row]:
    """Rows for ``cur`` with rates against ``prev`` (per node, measured dt), then aggregated
    over nodes unless ``per_node``. ``history`` (key -> depths) is extended in place."""
    node_rows = []
    for node, stats in cur.stats.items():
        now_rows = _node_rows(node, stats)
        before = _node_rows(node, prev.stats[node]) if prev and node in prev.stats else {}
        dt = cur.taken[node] - prev.taken[node] if prev and node in prev.taken else 0.0
        for key, (r, fins) in now_rows.items():
            if key in before and dt > 0:
                p, pfins = before[key]
                r.ingress = _rate(r.messages, p.messages, dt)
                r.requeue_rate = _rate(r.requeued, p.requeued, dt)
                r.timeout_rate = _rate(r.timed_out, p.timed_out, dt)
                # egress: finish deltas of consumers seen in both samples (a client that left
                # or reconnected never makes it negative)
                r.egress = sum(max(0, n - pfins[k]) for k, n in fins.items() if k in pfins) / dt
            node_rows.append(r)
    rows = node_rows if per_node else _aggregate(node_rows)
    if history is not None:
        for r in rows:
            h = history.setdefault(r.key, [])
            h.append(r.depth)
            del h[:-keep]
            r.history = list(h)
    return sorted(rows, key=lambda r: r.key)


def _aggregate(rows: list[Row]) -> list[Row]:
    agg: dict[tuple, Row] = {}
    for r in rows:
        key = (r.topic, r.channel)
        a = agg.get(key)
        if a is None:
            agg[key] = a = Row("*", r.topic, r.channel)
        for f in ("depth", "backend_depth", "in_flight", "deferred", "requeued", "timed_out", "messages",
                  "clients", "ready", "nodes", "ingress", "egress", "requeue_rate", "timeout_rate"):
            setattr(a, f, getattr(a, f) + getattr(r, f))
        a.paused = a.paused or r.paused
        a.client_list += r.client_list
    return list(agg.values())
