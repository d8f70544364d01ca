"""to-http's delivery: endpoints, one HTTP/1.1 exchange per message on keep-alive
connections (client/http.py's HTTPConnection, one per endpoint and worker thread), and the
modes (hostpool, round-robin, fanout). The caller FINs after a 2xx (POST) or 200 (GET) and
REQs on Failed, after Retry-After when the endpoint sent one."""

from __future__ import annotations

import threading
import time
import urllib.parse

from ..client.http import HTTPConnection


class Endpoint:
    def __init__(self, method: str, url: str):
        self.method, self.url = method, url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid URL {url!r}: expected http(s)://HOST[:PORT]/PATH")
        if method == "GET" and url.count("%s") != 1:
            raise ValueError(f"a --get URL needs exactly one %s (replaced by the query-escaped body): {url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.host_header = parts.netloc.rpartition("@")[2]
        self.key = (self.scheme, self.host, self.port)

    def target(self, body: bytes) -> str:
        url = self.url.replace("%s", urllib.parse.quote(body, safe="")) if self.method == "GET" else self.url
        parts = urllib.parse.urlsplit(url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class Failed(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        from email.utils import parsedate_to_datetime

        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class Deliverer:
    """Sends one message to the endpoints (per --mode) on keep-alive connections (one set per
    worker thread); the caller FINs on success and REQs on Failed."""

    def __init__(self, endpoints: list[Endpoint], mode: str, headers: dict, content_type: str,
                 connect_timeout: float, timeout: float):
        self.endpoints, self.mode = endpoints, mode
        lines = "".join(f"{k}: {v}\r\n" for k, v in {"User-Agent": "nsqcli-to-http", **headers}.items())
        self.get_headers = lines
        self.post_headers = lines + f"Content-Type: {content_type}\r\n"
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self.local = threading.local()
        self.next = 0
        self.lock = threading.Lock()

    def _conn(self, ep: Endpoint) -> HTTPConnection:
        """This thread's keep-alive connection to ``ep``."""
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        conn = conns.get(ep.key)
        if conn is None:
            conn = conns[ep.key] = HTTPConnection(ep.scheme, ep.host, ep.port, ep.host_header,
                                                  self.connect_timeout)
        return conn

    def send_one(self, ep: Endpoint, body: bytes) -> None:
        """One HTTP/1.1 exchange on this thread's kept-alive connection to ``ep`` under one
        deadline. (http.client with its email header parser cost ~250 us of CPU per message:
        0.34x nsq_to_http; this 0.70x.)"""
        post = ep.method == "POST"
        try:
            status, reason, headers, _ = self._conn(ep).request(
                ep.method, ep.target(body), time.monotonic() + self.timeout,
                body if post else None, self.post_headers if post else self.get_headers)
        except (OSError, ValueError) as e:  # the connection closed itself; the next one is new
            what = "timed out" if isinstance(e, TimeoutError) or "timed out" in str(e) else (
                getattr(e, "strerror", None) or str(e))
            raise Failed(f"{ep.method} {ep.url}: {what}") from None
        ok = 200 <= status < 300 if post else status == 200
        if not ok:
            raise Failed(f"{ep.method} {ep.url}: HTTP {status} {reason}", _retry_after(headers.get("retry-after")))

    def deliver(self, body: bytes) -> None:
        if self.mode == "fanout":
            errors = []
            for ep in self.endpoints:
                try:
                    self.send_one(ep, body)
                except Failed as e:
                    errors.append(e)
            if errors:
                raise Failed("; ".join(map(str, errors)), max((e.retry_after or 0 for e in errors), default=None) or None)
            return
        with self.lock:
            start = self.next
            if self.mode == "round-robin":
                self.next = (self.next + 1) % len(self.endpoints)
        last = None
        for i in range(len(self.endpoints)):  # hostpool: the current one, the next when it fails
            ep = self.endpoints[(start + i) % len(self.endpoints)]
            try:
                self.send_one(ep, body)
                if self.mode == "hostpool" and i:
                    with self.lock:
                        self.next = (start + i) % len(self.endpoints)
                return
            except Failed as e:
                last = e
                if e.retry_after is not None:
                    break  # the endpoint asked us to wait: do not hammer the others meanwhile
        raise last
