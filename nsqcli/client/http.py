"""HTTP clients for nsqlookupd and nsqd (v1 JSON, and the pre-1.0 status_code/data envelope).

Addresses may be ``host:port`` or a URL (``http://host:port[/path]``). Every failure raises
LookupdError(endpoint, status) with the server's message when it sent one.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass

from ..errors import LookupdError

ACCEPT = "application/vnd.nsq; version=1.0"


def base_url(address: str) -> str:
    """'host:port' or 'http://host:port/...' -> 'http://host:port' (path dropped)."""
    if "://" not in address:
        address = "http://" + address
    parts = urllib.parse.urlsplit(address)
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        raise ValueError(f"invalid HTTP address {address!r}: the port must be a number 1-65535") from None
    if not parts.hostname or parts.scheme not in ("http", "https"):
        raise ValueError(f"invalid HTTP address {address!r}: expected HOST:PORT or http://HOST:PORT")
    return f"{parts.scheme}://{parts.netloc}"


#: the most an HTTP answer may be (nsqd's /stats of a large node is a few MB)
MAX_RESPONSE = 64 * 1024 * 1024


def http_json(address: str, path: str, params: dict | None = None, timeout: float = 5.0,
              method: str = "GET", body: bytes | None = None):
    """Request ``path`` on ``address`` and return the decoded JSON (unwrapping old envelopes).

    ``timeout`` is a deadline for the whole request - connect, send, every byte of the answer -
    so a server that trickles its answer cannot hold the caller longer than that."""
    url = base_url(address) + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    status, headers, raw = _request(url, method, body, timeout)
    if status >= 400:
        raise LookupdError(_error_message(status, raw), url, status)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
    if "x-nsq-content-type" not in headers and isinstance(data, dict) and "status_code" in data:
        if data.get("status_code") != 200:  # pre-1.0 envelope: errors were wrapped too
            raise LookupdError(str(data.get("status_txt")), url, data.get("status_code"))
        data = data.get("data")
    return data


def http_get(address: str, path: str, params: dict | None = None, timeout: float = 5.0
             ) -> tuple[int, dict, bytes]:
    """GET ``path``: (status, lower-cased headers, body), under the same total deadline."""
    url = base_url(address) + path + ("?" + urllib.parse.urlencode(params) if params else "")
    return _request(url, "GET", None, timeout)


def _request(url: str, method: str, body: bytes | None, timeout: float) -> tuple[int, dict, bytes]:
    """One HTTP/1.0 exchange (the server closes after the answer) under a total deadline."""
    import socket
    import time

    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = (f"{method} {target} HTTP/1.0\r\nHost: {parts.netloc}\r\nAccept: {ACCEPT}\r\n"
            f"User-Agent: nsqcli\r\nContent-Length: {len(body or b'')}\r\n\r\n").encode()

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout()
        return remaining

    chunks, size = [], 0
    try:
        sock = socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                                        timeout=left())
        try:
            if parts.scheme == "https":
                import ssl

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
            sock.settimeout(left())
            sock.sendall(head + (body or b""))
            while True:
                sock.settimeout(left())
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_RESPONSE:
                    raise LookupdError(f"answer larger than {MAX_RESPONSE} bytes", url)
        finally:
            sock.close()
    except socket.timeout:
        raise LookupdError(f"no complete answer within {timeout:g}s", url) from None
    except OSError as e:
        raise LookupdError(f"unreachable ({e.strerror or e})", url) from None
    return _parse_response(b"".join(chunks), url)


def _parse_response(raw: bytes, url: str) -> tuple[int, dict, bytes]:
    head, sep, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if not sep or len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
        raise LookupdError(f"not an HTTP answer: {raw[:40]!r} (is this the HTTP port?)", url)
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = headers.get("content-length")
    if length is not None and length.isdigit():
        if len(payload) < int(length):
            raise LookupdError(f"answer cut short ({len(payload)} of {length} bytes)", url)
        payload = payload[:int(length)]
    return int(status_line[1]), headers, payload


def _error_message(status: int, raw: bytes) -> str:
    try:
        msg = json.loads(raw).get("message") or raw.decode()
    except (ValueError, AttributeError):
        msg = raw.decode("utf-8", "replace").strip()[:200]
    return f"HTTP {status} {msg}".rstrip()


@dataclass(frozen=True)
class Producer:
    """An nsqd as nsqlookupd reports it."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str = ""
    version: str = ""

    @property
    def tcp_address(self) -> str:
        host = self.broadcast_address
        return f"[{host}]:{self.tcp_port}" if ":" in host else f"{host}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        host = self.broadcast_address
        return f"[{host}]:{self.http_port}" if ":" in host else f"{host}:{self.http_port}"

    @classmethod
    def from_json(cls, p: dict) -> "Producer":
        if not isinstance(p.get("broadcast_address"), str):
            raise TypeError(f"broadcast_address is {p.get('broadcast_address')!r}")
        return cls(p["broadcast_address"], int(p["tcp_port"]), int(p["http_port"]),
                   str(p.get("hostname", "")), str(p.get("version", "")))


def lookup_topic(address: str, topic: str, timeout: float = 5.0) -> list[Producer]:
    """nsqd nodes producing ``topic`` according to one nsqlookupd ([] if unknown topic)."""
    try:
        data = http_json(address, "/lookup", {"topic": topic}, timeout)
    except LookupdError as e:
        if e.status == 404 and "TOPIC_NOT_FOUND" in str(e):  # nobody has it yet
            return []
        if e.status == 404:  # an nsqd's HTTP port (NOT_FOUND), or another web server
            raise LookupdError("answered HTTP 404 to /lookup: not an nsqlookupd HTTP address "
                               "(an nsqd HTTP port, or the wrong port?)", base_url(address)) from None
        raise
    try:
        return [Producer.from_json(p) for p in (data or {}).get("producers") or []]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise LookupdError(f"unexpected /lookup answer ({type(e).__name__}: {e}): {str(data)[:80]}",
                           base_url(address) + "/lookup") from None


def lookup_all(addresses: list[str], topic: str, timeout: float = 5.0
               ) -> tuple[list[Producer], list[LookupdError]]:
    """Ask EVERY lookupd; union the producers by tcp address. Returns (producers, errors)."""
    seen: dict[str, Producer] = {}
    errors: list[LookupdError] = []
    for address in addresses:
        try:
            for p in lookup_topic(address, topic, timeout):
                seen.setdefault(p.tcp_address, p)
        except LookupdError as e:
            errors.append(e)
    return list(seen.values()), errors


# -- the cluster as every nsqlookupd sees it (nsqcli lookup) --------------------------------------
@dataclass
class Node:
    """An nsqd node registered with nsqlookupd, with the topics it carries."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str
    version: str
    topics: dict[str, bool]  # topic -> tombstoned
    lookupds: list[str]

    @property
    def tcp_address(self) -> str:
        return Producer(self.broadcast_address, self.tcp_port, self.http_port).tcp_address

    @property
    def http_address(self) -> str:
        return Producer(self.broadcast_address, self.tcp_port, self.http_port).http_address

    def to_json(self) -> dict:
        return {"broadcast_address": self.broadcast_address, "hostname": self.hostname,
                "tcp_port": self.tcp_port, "http_port": self.http_port, "version": self.version,
                "tcp_address": self.tcp_address, "http_address": self.http_address,
                "topics": [{"topic": t, "tombstoned": tomb} for t, tomb in sorted(self.topics.items())],
                "lookupds": self.lookupds}


@dataclass
class ClusterView:
    """The union of what every reachable nsqlookupd said."""

    nodes: dict[str, Node]            # tcp address -> node
    topics: dict[str, set[str]]       # topic -> channels
    errors: list[LookupdError]
    answered: list[str]

    def producers(self, topic: str) -> list[Node]:
        return [n for n in self.nodes.values() if topic in n.topics]


def _lookupd_view(address: str, topic: str | None, timeout: float) -> tuple[list, dict[str, list[str]]]:
    """One lookupd's nodes [(Producer, [(topic, tombstoned)])] and channels {topic: [channel]}.
    An answer of the wrong shape is a LookupdError, like an unreachable lookupd."""
    def get(path, params=None):
        data = http_json(address, path, params, timeout)
        if data is not None and not isinstance(data, dict):
            raise TypeError(f"{path} answered {str(data)[:60]!r}, not a JSON object")
        return data or {}

    try:
        nodes = []
        for p in get("/nodes").get("producers") or []:
            tombs = p.get("tombstones") or []
            topics = [(str(t), bool(i < len(tombs) and tombs[i])) for i, t in enumerate(p.get("topics") or [])]
            nodes.append((Producer.from_json(p), topics))
        topics = [topic] if topic else [str(t) for t in get("/topics").get("topics") or []]
        channels = {}
        for t in topics:
            try:
                channels[t] = [str(c) for c in get("/channels", {"topic": t}).get("channels") or []]
            except LookupdError as e:
                if e.status != 404:
                    raise
                channels[t] = []
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise LookupdError(f"unexpected answer ({type(e).__name__}: {e})", base_url(address)) from None
    return nodes, channels


def cluster_view(addresses: list[str], topic: str | None = None, timeout: float = 5.0) -> ClusterView:
    """Ask every lookupd for /nodes and /topics (or just ``topic``) and the channels; union."""
    view = ClusterView({}, {}, [], [])
    for address in addresses:
        try:
            nodes, channels = _lookupd_view(address, topic, timeout)
        except LookupdError as e:
            view.errors.append(e)
            continue
        view.answered.append(address)
        for t, chans in channels.items():
            view.topics.setdefault(t, set()).update(chans)
        for prod, topics in nodes:
            node = view.nodes.setdefault(prod.tcp_address, Node(
                prod.broadcast_address, prod.tcp_port, prod.http_port, prod.hostname, prod.version, {}, []))
            node.lookupds.append(address)
            for t, tombstoned in topics:
                if topic is None or t == topic:
                    node.topics[t] = node.topics.get(t, False) or tombstoned
                    view.topics.setdefault(t, set())
    return view
