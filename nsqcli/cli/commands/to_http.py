"""``nsqcli to-http``: deliver messages to a web service (nsq_to_http). FIN after a 2xx (POST) or
200 (GET); REQ with backoff otherwise, after Retry-After when the endpoint says so."""

from __future__ import annotations

import random
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import click

from ..command import command, option
from ..options import build_config, connection_options, nsqd_addresses, pop_connection
from ..types import CHANNEL, DURATION, TOPIC


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


def _read_response(sock, buf: bytes, deadline: float) -> tuple[int, str, dict, bytes]:
    """Status, reason, lower-cased headers and the bytes left over after this answer."""

    def more() -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        return chunk

    while b"\r\n\r\n" not in buf:
        buf += more()
        if len(buf) > 1 << 20:
            raise ValueError("response head over 1 MiB")
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:60]!r}")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    status = int(parts[1])
    if status in (204, 304) or 100 <= status < 200:
        return status, parts[2] if len(parts) > 2 else "", headers, rest
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:  # chunk-size line, data, CRLF ... until a 0-size chunk and its trailer
            while b"\r\n" not in rest:
                rest += more()
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                while b"\r\n" not in rest:
                    rest += more()
                rest = rest.partition(b"\r\n")[2] if rest.startswith(b"\r\n") else rest.partition(b"\r\n\r\n")[2]
                break
            while len(rest) < size + 2:
                rest += more()
            rest = rest[size + 2:]
    elif "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            rest += more()
        rest = rest[n:]
    else:  # the body ends when the server closes: read it and drop the connection
        headers["connection"] = "close"
        try:
            while True:
                rest += more()
        except ConnectionResetError:
            rest = b""
    return status, parts[2] if len(parts) > 2 else "", headers, rest


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
        self.headers = {"User-Agent": "nsqcli-to-http", **headers}
        self.content_type = content_type
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self.local = threading.local()
        self.next = 0
        self.lock = threading.Lock()

    def _sock(self, ep: Endpoint):
        """This thread's keep-alive connection to ``ep`` (a plain socket; TLS for https)."""
        import socket

        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        entry = conns.get(ep.key)
        if entry is None:
            port = ep.port or (443 if ep.scheme == "https" else 80)
            sock = socket.create_connection((ep.host, port), timeout=self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ep.scheme == "https":
                import ssl

                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=ep.host)
            entry = conns[ep.key] = [sock, b""]
        return entry

    def _drop(self, ep: Endpoint) -> None:
        entry = getattr(self.local, "conns", {}).pop(ep.key, None)
        if entry is not None:
            entry[0].close()

    def send_one(self, ep: Endpoint, body: bytes) -> None:
        """One HTTP/1.1 exchange on a kept-alive socket: the request in one write, the answer
        read by Content-Length (or chunked) under one deadline. (http.client with its email
        header parser cost ~250 us of CPU per message: 0.34x nsq_to_http; this 0.70x.)"""
        deadline = time.monotonic() + self.timeout
        head = [f"{ep.method} {ep.target(body)} HTTP/1.1", f"Host: {ep.host_header}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        payload = b""
        if ep.method == "POST":
            head += [f"Content-Type: {self.content_type}", f"Content-Length: {len(body)}"]
            payload = body
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
        try:
            entry = self._sock(ep)
            sock = entry[0]
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(request)
            status, reason, headers, entry[1] = _read_response(sock, entry[1], deadline)
        except (OSError, ValueError) as e:
            self._drop(ep)
            what = "timed out" if isinstance(e, TimeoutError) or "timed out" in str(e) else (
                getattr(e, "strerror", None) or str(e))
            raise Failed(f"{ep.method} {ep.url}: {what}") from None
        if headers.get("connection", "").lower() == "close":
            self._drop(ep)
        ok = 200 <= status < 300 if ep.method == "POST" else status == 200
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


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.delivered = self.failed = self.sampled_out = 0
        self.sending = 0  # requests started and not finished (-n counts them as taken)
        self.last = time.monotonic()


@command("to-http", examples="""
nsqcli to-http -t events --post http://127.0.0.1:8080/ingest
nsqcli to-http -t events --post http://a/ingest --post http://b/ingest --mode round-robin --concurrency 32
nsqcli to-http -t events --get 'http://127.0.0.1:8080/hook?msg=%s' --sample 0.1
nsqcli to-http -t events --post https://api.example/v1 --header 'Authorization: Bearer X' \\
    --content-type application/json --http-timeout 5s
""")
@option("-t", "--topic", required=True, type=TOPIC, help="Topic to deliver.")
@option("-c", "--channel", type=CHANNEL, default="nsq_to_http", show_default=True)
@option("--post", "posts", multiple=True, metavar="URL", help="POST each message body here (repeatable).")
@option("--get", "gets", multiple=True, metavar="URL",
        help="GET this URL with %s replaced by the query-escaped body (repeatable).")
@option("--header", "headers", multiple=True, metavar="'KEY: VALUE'", help="An HTTP header (repeatable).")
@option("--content-type", default="application/octet-stream", show_default=True, help="POST Content-Type.")
@option("--mode", type=click.Choice(["hostpool", "round-robin", "fanout"]), default="hostpool", show_default=True,
        help="hostpool: one endpoint, the next when it fails; round-robin: messages alternate; fanout: every "
             "endpoint (FIN when all succeeded).")
@option("--sample", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
        help="Deliver this fraction of messages; the others are FINed without delivery.")
@option("--concurrency", type=click.IntRange(1, 1000), default=100, show_default=True,
        help="Requests in flight at once (nsq_to_http's -n; here -n is --count as in every nsqcli command).")
@option("--max-in-flight", type=click.IntRange(1, 100000), default=200, show_default=True)
@option("--http-connect-timeout", type=DURATION, default="2s", show_default=True, group="HTTP")
@option("--http-timeout", type=DURATION, default="20s", show_default=True, group="HTTP",
        help="For the whole request.")
@option("--requeue-delay", type=DURATION, default="90s", show_default=True, group="HTTP",
        help="A failed message comes back after this x its attempts (capped at 15m), unless the endpoint "
             "sent Retry-After.")
@option("-n", "--count", type=click.IntRange(0), default=0, help="Stop after delivering N messages.")
@option("--idle-timeout", type=DURATION, help="Stop after no message for this long.")
@option("--live/--no-live", default=None, help="Live connections table (default: when stderr is a TTY).")
@option("--status-interval", type=DURATION, default="60s", show_default=True,
        help="Without --live: a status line this often (0 = off).")
@connection_options(consumer=True)
@click.pass_obj
def to_http(app, topic, channel, posts, gets, headers, content_type, mode, sample, concurrency, max_in_flight,
            http_connect_timeout, http_timeout, requeue_delay, count, idle_timeout, live, status_interval, **kwargs):
    """Deliver TOPIC's messages to HTTP endpoints (nsq_to_http).

    A message is FINed after a 2xx answer to a POST (200 to a GET), otherwise requeued with
    backoff: a dead or failing endpoint slows the whole consumer down instead of spinning, and a
    Retry-After (seconds or HTTP date) sets when the message comes back. At least once: killed at
    any moment, what was not FINed is redelivered.
    """
    from ...client.consumer import Consumer
    from ..app import Outages, source_error, sources_recovered

    conn = pop_connection(kwargs)
    if bool(posts) == bool(gets):
        raise click.UsageError("give --post URL or --get URL (not both)")
    try:
        endpoints = [Endpoint("POST", u) for u in posts] + [Endpoint("GET", u) for u in gets]
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    hdrs = {}
    for h in headers:
        key, sep, value = h.partition(":")
        if not sep or not key.strip():
            raise click.UsageError(f"--header {h!r} must be 'Key: value'")
        hdrs[key.strip()] = value.strip()
    for name, value in (("--http-timeout", http_timeout), ("--http-connect-timeout", http_connect_timeout)):
        if value <= 0:
            raise click.BadParameter("must be more than 0", param_hint=f"'{name}'")
    deliverer = Deliverer(endpoints, mode, hdrs, content_type, http_connect_timeout, http_timeout)
    stats = Stats()
    outages = Outages(app)  # each failure said when it starts, counted, then "recovered"
    done = threading.Event()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="nsqcli-http")
    rng = random.Random()

    def claim() -> bool:
        """-n N: a request may start only while delivered + sending < N (with 100 requests in
        flight, the ones already started when the Nth succeeded delivered N + 28)."""
        with stats.lock:
            if count and stats.delivered + stats.sending >= count:
                return False
            stats.sending += 1
            return True

    def work(m) -> None:
        if done.is_set() or not claim():  # stopping, or -n is taken: it goes back at once
            m.requeue(delay=0, backoff=False)
            return
        try:
            deliver(m)
        finally:
            with stats.lock:
                stats.sending -= 1

    def deliver(m) -> None:
        try:
            deliverer.deliver(m.body)
        except Failed as e:
            with stats.lock:
                stats.failed += 1
            outages.failed("delivery", f"{e} (requeued; the consumer backs off)")
            delay = e.retry_after if e.retry_after is not None else min(900.0, requeue_delay * m.attempts)
            m.requeue(delay=delay, backoff=True)
            return
        except BaseException as e:  # a bug: give the message back, say it
            app.warn(f"delivery failed: {type(e).__name__}: {e}")
            m.requeue(delay=0, backoff=True)
            return
        m.finish()
        outages.ok("delivery", "delivery")
        with stats.lock:
            stats.delivered += 1
            stats.last = time.monotonic()
            if count and stats.delivered >= count:
                done.set()

    def handle(msgs) -> None:
        for m in msgs:
            if done.is_set():
                m.requeue(delay=0, backoff=False)
                continue
            if sample < 1.0 and rng.random() >= sample:
                with stats.lock:
                    stats.sampled_out += 1
                continue  # FINed by the batch (auto-response)
            m.disable_auto_response()
            pool.submit(work, m)

    cfg = build_config(conn, max_in_flight=max_in_flight, max_attempts=0, default_requeue_delay=requeue_delay)
    c = Consumer(topic, channel, batch_handler=handle, config=cfg, on_error=lambda e: source_error(outages, e),
                 nsqd_tcp_addresses=nsqd_addresses(conn),
                 lookupd_http_addresses=list(conn.get("lookupd_http_addresses") or ()))
    from ..signals import GracefulStop

    stopper = GracefulStop(done).install()
    start = time.monotonic()
    view = None
    try:
        with stopper.blocking():  # a signal while connecting ends it at once (130)
            c.start()
        if live or (live is None and app.stderr_is_tty):
            from ..views import LiveConnections

            view = LiveConnections(app.console, [c]).start()
        next_status = start + status_interval if status_interval and view is None else None
        while not done.wait(0.2):
            now = time.monotonic()
            if idle_timeout and now - max(stats.last, start) >= idle_timeout:
                break
            if next_status is not None and now >= next_status:
                app.info(_status(stats, now - start))
                next_status = now + status_interval
            sources_recovered(outages, [c])
    finally:
        done.set()
        if view is not None:
            view.stop()
        pool.shutdown(wait=True)  # every request in flight is answered (FIN or REQ) before close
        c.stop(timeout=15)
    app.info(_status(stats, time.monotonic() - start))
    return 0


def _status(stats: Stats, elapsed: float) -> str:
    return (f"delivered {stats.delivered:,}, failed attempts {stats.failed:,} (requeued), sampled out "
            f"{stats.sampled_out:,}, {stats.delivered / max(elapsed, 1e-9):,.0f} msg/s")
