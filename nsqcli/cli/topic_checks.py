"""What tail asks nsqd before it subscribes, over HTTP, every node at once under one deadline:
which nodes carry a topic (given, nsqlookupd's producers, or TCP port + 1 checked by /info), a
backlog an ephemeral channel would drop, a channel's depth per node (--peek), a durable channel's
other consumers, the topics matching --topic-pattern."""

from __future__ import annotations

from .options import nsqd_addresses
from ..clock import left


def _left(by: float) -> float:
    return left(by, float("inf"))


def http_addresses(topic: str, conn: dict, nsqd_http: list[str], by: float) -> tuple[list[str], list[str]]:
    """nsqd HTTP addresses to check for ``topic`` and the problems met (see :func:`http_nodes`)."""
    nodes, problems = http_nodes(topic, conn, nsqd_http, by)
    return list(nodes), problems


def http_nodes(topic: str, conn: dict, nsqd_http: list[str], by: float) -> tuple[dict, list[str]]:
    """nsqd HTTP addresses to check for ``topic``, each with its TCP address as the consumer
    names it (None: not known): given ones (their TCP address is asked later, by /info); lookupd's
    producers; else the TCP port + 1 convention, used only where that port's /info names the TCP
    port given (another nsqd there, or a port forward, would answer for the wrong node). Every
    node's /info and the lookups are asked at once, by ``by``. Returns ({http: tcp}, problems)."""
    if nsqd_http:
        return dict.fromkeys(nsqd_http), []
    from ..client import limits
    from ..client.fanout import ask_all
    from ..client.http import lookup_all
    from ..client.transport import split_address
    from ..defaults import NSQD_TCP_ADDRESS

    tcps = list(dict.fromkeys(conn.get("nsqd_tcp_addresses")
                              or (() if conn.get("lookupd_http_addresses") else (NSQD_TCP_ADDRESS,))))
    lookupds = list(conn.get("lookupd_http_addresses") or ())
    jobs = [("tcp", a) for a in tcps] + ([("lookup", None)] if lookupds else [])

    def ask(job):
        kind, tcp = job
        if kind == "lookup":
            return lookup_all(lookupds, topic, _left(by))
        return limits.http_address_of(tcp, by)

    out, problems = {}, []
    # slack: lookup_all's own round (its hung nsqlookupd named) ends before this one does
    answers = ask_all(jobs, ask, _left(by), slack=0.6,
                      name=lambda job: f"nsqd {job[1]}" if job[1] else ", ".join(lookupds))
    for (kind, tcp), a in zip(jobs, answers):
        if kind == "lookup":
            producers, errors = a.value if a.ok else ([], [a.error])
            for p in producers:
                out.setdefault(p.http_address, p.tcp_address)
            problems += [str(e) for e in errors]
        elif a.ok and a.value:
            out.setdefault(a.value, tcp)
        else:
            try:
                host, port = split_address(tcp)
                guess = (f"[{host}]" if ":" in host else host) + f":{port + 1}"
                problems.append(f"nsqd {tcp}: its HTTP address is not known ({guess}, TCP port + 1, "
                                f"did not answer /info as the nsqd of TCP port {port})")
            except ValueError:
                problems.append(f"nsqd {tcp}: its HTTP address is not known")
    return out, problems


def refuse_backlog(topic: str, conn: dict, nsqd_http: list[str], by: float) -> list[str]:
    """Refuse (exit 1) to subscribe an ephemeral channel to a topic that has a backlog and no
    channel: the first channel takes the whole backlog, an ephemeral one drops most of it.
    Returns what could not be checked."""
    from ..errors import NSQError

    addresses, problems = http_addresses(topic, conn, nsqd_http, by)
    for address, a in zip(addresses, stats_of(addresses, {"topic": topic}, _left(by))):
        if a.error is not None or not isinstance(a.value or {}, dict):
            problems.append(str(a.error) if a.error is not None else f"{address}: /stats is not a JSON object")
            continue
        for t in (a.value or {}).get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            depth = int(t.get("depth", 0))
            if depth > 0 and not t.get("channels"):
                raise NSQError(
                    f"topic {topic!r} on nsqd {address} has {depth} messages and no channel yet: the first channel "
                    "takes that backlog from every channel created later, and tail's ephemeral channel keeps "
                    "at most nsqd's --mem-queue-size of it. Read it durably with --channel NAME, or take "
                    "it anyway with --drain-backlog")
    return problems


def channel_depth(topic: str, channel: str, conn: dict, nsqd_http: list[str], by: float):
    """(problems, depths) of the channel on every node carrying the topic: {nsqd TCP address (None
    when not known): depth}, or None when no node that answered has the channel. Depth: what can
    be delivered now (deferred are not)."""
    nodes, problems = http_nodes(topic, conn, nsqd_http, by)
    tcps = nsqd_addresses(conn) if conn.get("nsqd_tcp_addresses") else []

    def ask(address):
        from ..client.http import http_json

        stats = http_json(address, "/stats", {"format": "json", "topic": topic, "channel": channel},
                          timeout=_left(by))
        tcp = nodes[address]
        if tcp is None:  # a given HTTP address: its TCP port, matched to an address the consumer uses
            info = http_json(address, "/info", timeout=_left(by))
            tcp = tcp_of(address, info.get("tcp_port") if isinstance(info, dict) else None, tcps)
        return stats, tcp

    from ..client.http import ask_http

    depths = None
    for address, a in zip(nodes, ask_http(list(nodes), ask, _left(by))):
        stats, tcp = a.value if a.error is None else (None, None)
        if a.error is not None or not isinstance(stats, dict):
            problems.append(str(a.error) if a.error is not None else f"{address}: /stats is not a JSON object")
            continue
        for t in stats.get("topics") or []:
            for c in t.get("channels") or []:
                if t.get("topic_name") == topic and c.get("channel_name") == channel:
                    depths = depths if depths is not None else {}
                    depths[tcp] = depths.get(tcp, 0) + int(c.get("depth", 0))
    if depths is None and not problems:
        problems.append(f"no nsqd ({', '.join(nodes) or 'none found'}) has it")
    return problems, depths


def tcp_of(http: str, tcp_port, tcps: list[str]) -> str | None:
    """The TCP address, among the consumer's ``tcps``, of the nsqd at ``http`` whose /info said
    ``tcp_port``: the same host and port, else the only one with that port; None when unsure."""
    from ..client.transport import split_address

    if not isinstance(tcp_port, int):
        return None
    try:
        host, _ = split_address(http)
        same = (f"[{host}]" if ":" in host else host) + f":{tcp_port}"
        ports = [t for t in tcps if split_address(t)[1] == tcp_port]
    except ValueError:
        return None
    if same in tcps or not tcps:
        return same
    return ports[0] if len(ports) == 1 else None


def warn_not_counted(app, topic: str, problems: list[str]) -> None:
    """--peek: a node (or nsqlookupd) that did not answer: its backlog is not counted, so the peek
    can end, or say every message was looked at, without its messages (said, not silent)."""
    for p in problems:
        app.warn(f"--peek: topic {topic}: {p}: a backlog there is not counted, and may not be looked at (the "
                 "peek connects to the nodes that said they have the channel)")


def require_channel(topic: str, channel: str, conn: dict, nsqd_http: list[str], by: float) -> tuple[dict, list]:
    """--peek: the channel must exist on some node (subscribing would create it, and a new channel
    keeps a copy of everything published from then on). Returns (its depth on each node, the
    problems of the nodes that did not answer)."""
    from ..errors import NSQError

    problems, depths = channel_depth(topic, channel, conn, nsqd_http, by)
    if depths is None:
        raise NSQError(f"--peek: channel {topic}/{channel} does not exist ({'; '.join(problems)}): there is nothing "
                       "to peek at, and subscribing would create it")
    return depths, problems


def matching_topics(conn: dict, pattern, by: float, cancel=None) -> tuple:
    """--topic-pattern: the topics any nsqlookupd knows that match (NSQError when none answered).
    ``cancel``: ask_all's (a stop ends the round: NSQError)."""
    from ..client.http import ask_http, http_json
    from ..errors import NSQError

    lookupds = list(conn.get("lookupd_http_addresses") or ())
    found, errors = set(), []
    for a in ask_http(lookupds, lambda address: http_json(address, "/topics", timeout=_left(by)), _left(by), cancel):
        if a.error is not None or not isinstance(a.value, dict):
            errors.append(str(a.error) if a.error is not None else "/topics is not a JSON object")
            continue
        found |= set(a.value.get("topics") or [])
    if errors and len(errors) == len(lookupds):
        raise NSQError(f"--topic-pattern: no nsqlookupd answered /topics ({'; '.join(errors)})")
    return tuple(sorted(t for t in found if isinstance(t, str) and pattern.search(t)))


def warn_shared_channel(app, topic: str, channel: str, conn: dict, nsqd_http: list[str], by: float) -> None:
    """A durable channel that already has consumers: what tail shows (and FINs) they never get."""
    addresses, _ = http_addresses(topic, conn, nsqd_http, by)
    others = 0
    for a in stats_of(addresses, {"topic": topic, "channel": channel}, _left(by)):
        if a.error is not None or not isinstance(a.value, dict):
            continue
        for t in a.value.get("topics") or []:
            for c in t.get("channels") or []:
                if t.get("topic_name") == topic and c.get("channel_name") == channel:
                    others += int(c.get("client_count", 0))
    if others:
        app.warn(f"channel {topic}/{channel} has {others} other consumer(s): the messages tail shows are "
                 "FINed here and never reach them (leave out --channel for a copy of every message)")


def stats_of(addresses: list[str], params: dict, timeout: float) -> list:
    """Every node's /stats (``params``) at once, in one round of ``timeout``: one Answer each."""
    from ..client.http import ask_http, http_json

    return ask_http(addresses, lambda a: http_json(a, "/stats", {"format": "json", **params}, timeout=timeout),
                    timeout)
