"""HTTP clients for nsqlookupd and nsqd (v1 JSON, and the pre-1.0 status_code/data envelope).

Addresses may be ``host:port`` or a URL (``http://host:port[/path]``). Every failure raises
LookupdError(endpoint, status) with the server's message when it sent one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from .errors import LookupdError

ACCEPT = "application/vnd.nsq; version=1.0"


def base_url(address: str) -> str:
    """'host:port' or 'http://host:port/...' -> 'http://host:port' (path dropped)."""
    if "://" not in address:
        address = "http://" + address
    parts = urllib.parse.urlsplit(address)
    if not parts.hostname or parts.scheme not in ("http", "https"):
        raise ValueError(f"invalid HTTP address {address!r}: expected HOST:PORT or http://HOST:PORT")
    return f"{parts.scheme}://{parts.netloc}"


def http_json(address: str, path: str, params: dict | None = None, timeout: float = 5.0,
              method: str = "GET", body: bytes | None = None):
    """Request ``path`` on ``address`` and return the decoded JSON (unwrapping old envelopes)."""
    url = base_url(address) + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    req = urllib.request.Request(url, data=body, method=method, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, headers = resp.read(), resp.headers
    except urllib.error.HTTPError as e:
        raise LookupdError(_error_message(e), url, e.code) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise LookupdError(f"unreachable ({getattr(reason, 'strerror', None) or reason})", url) from None
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
    if "X-NSQ-Content-Type" not in headers and isinstance(data, dict) and "status_code" in data:
        if data.get("status_code") != 200:  # pre-1.0 envelope: errors were wrapped too
            raise LookupdError(str(data.get("status_txt")), url, data.get("status_code"))
        data = data.get("data")
    return data


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read()
        msg = json.loads(body).get("message") or body.decode()
    except (ValueError, AttributeError, OSError):
        msg = e.reason
    return f"HTTP {e.code} {msg}"


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
        return cls(p["broadcast_address"], int(p["tcp_port"]), int(p["http_port"]),
                   p.get("hostname", ""), p.get("version", ""))


def lookup_topic(address: str, topic: str, timeout: float = 5.0) -> list[Producer]:
    """nsqd nodes producing ``topic`` according to one nsqlookupd ([] if unknown topic)."""
    try:
        data = http_json(address, "/lookup", {"topic": topic}, timeout)
    except LookupdError as e:
        if e.status == 404:  # TOPIC_NOT_FOUND: nobody has it yet
            return []
        raise
    return [Producer.from_json(p) for p in (data or {}).get("producers") or []]


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
