"""Prometheus metrics and a health endpoint for a long-running command (``--metrics-address``).

``serve("127.0.0.1:9117", snapshot)`` listens on a daemon thread and answers:

- ``GET /metrics``: Prometheus's text format (prometheus_client's own exposition,
  ``generate_latest`` on a private registry). ``snapshot()`` is called once per scrape, so the
  hot path never touches a prometheus object.
- ``GET /healthz``: 200 ``ok`` or 503 ``<reason>`` from ``snapshot()["health"]``; with
  ``?format=json``: ``{"ok": ..., "reason": ..., "state": ..., "uptime_seconds": ...}``, same status.
- ``GET /status``: the whole snapshot as JSON (what ``--status-file`` holds).
- anything else: 404. A ``snapshot()`` that raises: 500 with one line; the server keeps serving.
  No request is logged.

The metrics (every series has the label ``command``: to-file, to-nsq, to-http or tail; counters
are cumulative since the process started and never reset):

==========================================  ===========================  ===========================
name                                        labels                       from the snapshot
==========================================  ===========================  ===========================
nsqcli_info (always 1)                      command, version, pid        command, pid
nsqcli_uptime_seconds                       command                      uptime_seconds
nsqcli_start_time_seconds                   command                      started_at (epoch)
nsqcli_healthy (1/0)                        command                      health.ok
nsqcli_messages_received_total              command, topic, channel      topics[].received
nsqcli_messages_finished_total              command, topic, channel      topics[].finished
nsqcli_messages_requeued_total              command, topic, channel      topics[].requeued
nsqcli_messages_timed_out_total             command, topic, channel      topics[].timed_out
nsqcli_responses_lost_total                 command, topic, channel      topics[].lost_responses
nsqcli_connection_up (1/0)                  command, topic, channel,     connections[].connected
                                            nsqd
nsqcli_connection_rdy                       ... nsqd                     connections[].rdy
nsqcli_connection_in_flight                 ... nsqd                     connections[].in_flight
nsqcli_channel_depth                        command, topic, channel,     depth[].depth (lag, as
                                            nsqd                         nsqd's /stats said)
nsqcli_channel_in_flight                    ... nsqd                     depth[].in_flight
nsqcli_channel_deferred                     ... nsqd                     depth[].deferred
nsqcli_channel_seen_timestamp_seconds       ... nsqd                     depth[].seen_at (epoch)
nsqcli_<counter>_total                      command                      counters: bytes_written,
                                                                         fsyncs, files_rotated,
                                                                         copied, filtered,
                                                                         failed_batches, too_big,
                                                                         given_up, delivered,
                                                                         failed_attempts,
                                                                         sampled_out, shown
nsqcli_<gauge>                              command                      gauges: e.g.
                                                                         last_fsync_timestamp_seconds
nsqcli_errors_total                         command, kind                errors (source, write,
                                                                         destination, delivery,
                                                                         lookupd)
nsqcli_delivery_latency_seconds (histogram) command                      latency (to-nsq, to-http)
==========================================  ===========================  ===========================

A counter or gauge name that is not a valid metric name has its other characters made ``_``; one
that would clash with a metric above is given as ``nsqcli_counter_<name>`` (``nsqcli_gauge_<name>``).
A value that is None (not known yet: no fsync so far) gives no sample.

This module imports only the standard library at import time; prometheus_client is imported by
:func:`serve` (the harness imports this module only when ``--metrics-address`` is given).
"""

from __future__ import annotations

import json
import re
import threading

from ..version import __version__

#: how long one client may take to send its request (a stuck scraper holds only its own thread)
REQUEST_TIMEOUT = 5.0

_PER_TOPIC = (("received", "messages_received", "Messages received from nsqd"),
              ("finished", "messages_finished", "Messages FINished"),
              ("requeued", "messages_requeued", "Messages REQueued"),
              ("timed_out", "messages_timed_out", "Messages that timed out in flight (nsqd gave them to another consumer)"),
              ("lost_responses", "responses_lost", "FIN/REQ/TOUCH responses lost with their connection"))
_PER_CONNECTION = (("rdy", "connection_rdy", "RDY count given to this nsqd"),
                   ("in_flight", "connection_in_flight", "Messages in flight on this connection"))
_PER_DEPTH = (("depth", "channel_depth", "Channel depth (messages waiting: lag) as nsqd's /stats last said"),
              ("in_flight", "channel_in_flight", "Messages in flight on the channel as nsqd's /stats last said"),
              ("deferred", "channel_deferred", "Deferred messages on the channel as nsqd's /stats last said"),
              ("seen_at", "channel_seen_timestamp_seconds", "When nsqd's /stats was last read for this channel (epoch)"))
_RESERVED = ({"nsqcli_info", "nsqcli_uptime_seconds", "nsqcli_start_time_seconds", "nsqcli_healthy",
              "nsqcli_connection_up", "nsqcli_errors", "nsqcli_delivery_latency_seconds"}
             | {f"nsqcli_{name}" for _, name, _ in _PER_TOPIC + _PER_CONNECTION + _PER_DEPTH})
_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (every interface) -> (host, port); port 0 is any
    free port. Raises ValueError with a one-line reason."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError("metrics address is empty: expected HOST:PORT (e.g. 127.0.0.1:9117)")
    host, sep, port = address.strip().rpartition(":")
    if not sep:
        raise ValueError(f"metrics address {address!r} has no port: expected HOST:PORT (e.g. 127.0.0.1:9117)")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(f"metrics address {address!r}: an IPv6 host is written [ADDR]:PORT")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"metrics address {address!r}: an IPv6 host is written [ADDR]:PORT")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {address!r}: port {port!r} is not a number from 0 to 65535")
    if any(c.isspace() or c in "/?#@" for c in host):
        raise ValueError(f"metrics address {address!r}: {host!r} is not a host name or address")
    return host, int(port)


def _metric_name(prefix: str, key: str, used: set) -> str:
    """nsqcli_<key> with invalid characters made '_'; nsqcli_<prefix>_<key> when that is taken."""
    name = "nsqcli_" + _BAD_CHARS.sub("_", str(key))
    if name in _RESERVED or name in used:
        name = f"nsqcli_{prefix}_" + name[len("nsqcli_"):]
    used.add(name)
    return name


def _number(value):
    """A sample value, or None (no sample) for None and anything that is not a number."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return value
    return None


def families(snap: dict):
    """The metric families of one snapshot (prometheus_client.core objects)."""
    command = str(snap.get("command", ""))
    yield from _process_families(snap, command)
    yield from _topic_families(snap.get("topics") or [], command)
    yield from _connection_families(snap.get("connections") or [], snap.get("depth") or [], command)
    yield from _named_families(snap, command)
    latency = snap.get("latency")
    if latency:
        yield _latency_family(latency, command)


def _process_families(snap: dict, command: str):
    """nsqcli_info, uptime and start time, healthy."""
    from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

    c = [command]
    info = InfoMetricFamily("nsqcli", "This nsqcli process", labels=["command", "version", "pid"])
    info.add_metric([command, __version__, str(snap.get("pid", ""))], {})
    yield info
    for key, name, doc in (("uptime_seconds", "uptime_seconds", "Seconds since the process started"),
                           ("started_at", "start_time_seconds", "When the process started (epoch)")):
        value = _number(snap.get(key))
        if value is not None:
            yield _one(GaugeMetricFamily, f"nsqcli_{name}", doc, c, value)
    health = snap.get("health") or {}
    yield _one(GaugeMetricFamily, "nsqcli_healthy", "1 while /healthz answers 200, else 0", c,
               1 if health.get("ok") else 0)


def _topic_families(rows: list, command: str):
    """The counters of _PER_TOPIC, one sample per topic/channel."""
    from prometheus_client.core import CounterMetricFamily

    for key, name, doc in _PER_TOPIC:
        fam = CounterMetricFamily(f"nsqcli_{name}", doc, labels=["command", "topic", "channel"])
        for row in rows:
            value = _number(row.get(key))
            if value is not None:
                fam.add_metric([command, str(row.get("topic", "")), str(row.get("channel", ""))], value)
        yield fam


def _connection_families(rows: list, depth_rows: list, command: str):
    """Per nsqd connection: up, the gauges of _PER_CONNECTION, then those of _PER_DEPTH."""
    from prometheus_client.core import GaugeMetricFamily

    labels = ["command", "topic", "channel", "nsqd"]
    up = GaugeMetricFamily("nsqcli_connection_up", "1 while the connection to this nsqd is up, else 0", labels=labels)
    per = [(key, GaugeMetricFamily(f"nsqcli_{name}", doc, labels=labels)) for key, name, doc in _PER_CONNECTION]
    for row in rows:
        lv = [command, str(row.get("topic", "")), str(row.get("channel", "")), str(row.get("nsqd", ""))]
        up.add_metric(lv, 1 if row.get("connected") else 0)
        for key, fam in per:
            value = _number(row.get(key))
            if value is not None:
                fam.add_metric(lv, value)
    yield up
    yield from (fam for _, fam in per)

    for key, name, doc in _PER_DEPTH:
        fam = GaugeMetricFamily(f"nsqcli_{name}", doc, labels=labels)
        for row in depth_rows:
            value = _number(row.get(key))
            if value is not None:
                fam.add_metric([command, str(row.get("topic", "")), str(row.get("channel", "")),
                                str(row.get("nsqd", ""))], value)
        yield fam


def _named_families(snap: dict, command: str):
    """The command's own counters and gauges (named from their keys), then errors by kind."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    c = [command]
    used: set = set()
    for key, value in (snap.get("counters") or {}).items():
        value = _number(value)
        if value is not None:
            name = _metric_name("counter", key[:-len("_total")] if key.endswith("_total") else key, used)
            yield _one(CounterMetricFamily, name, f"{command}: {key} since the process started", c, value)
    for key, value in (snap.get("gauges") or {}).items():
        value = _number(value)
        if value is not None:
            yield _one(GaugeMetricFamily, _metric_name("gauge", key, used), f"{command}: {key}", c, value)

    errors = CounterMetricFamily("nsqcli_errors", "Errors since the process started, by kind",
                                 labels=["command", "kind"])
    for kind, value in (snap.get("errors") or {}).items():
        value = _number(value)
        if value is not None:
            errors.add_metric([command, str(kind)], value)
    yield errors


def _latency_family(latency: dict, command: str):
    """The delivery latency histogram (its buckets end with +Inf)."""
    from prometheus_client.core import HistogramMetricFamily
    from prometheus_client.utils import floatToGoString

    buckets, count = [], 0
    for le, n in latency.get("buckets") or []:
        le = "+Inf" if le in ("+Inf", float("inf")) else floatToGoString(float(le))
        count = n
        buckets.append((le, n))
    if not buckets or buckets[-1][0] != "+Inf":
        buckets.append(("+Inf", latency.get("count", count)))
    hist = HistogramMetricFamily("nsqcli_delivery_latency_seconds",
                                 "Delivery latency (message received to destination's answer)", labels=["command"])
    hist.add_metric([command], buckets, _number(latency.get("sum")) or 0.0)
    return hist


def _one(cls, name: str, doc: str, labels: list, value):
    """A family of one sample, labelled with the command."""
    fam = cls(name, doc, labels=["command"])
    fam.add_metric(labels, value)
    return fam


class MetricsServer:
    """The running endpoint: ``address`` is the bound "host:port"; :meth:`close` stops it."""

    def __init__(self, httpd, thread: threading.Thread):
        self._httpd = httpd
        self._thread = thread
        host, port = httpd.server_address[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def close(self) -> None:
        """Stop answering and release the port (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._thread.join(timeout=2.0)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<MetricsServer {self.address}{'' if self._httpd else ' closed'}>"


def _load_prometheus_client() -> None:
    """Import prometheus_client without python-snappy: its exposition module imports snappy if it
    can (only for push-gateway compression, never used here), and snappy's cramjam costs a
    daemon 1.7 MB of RSS (bench/daemon_metrics.py, bench/figures.md). snappy stays importable
    afterwards (nsqd connections with --snappy import it themselves)."""
    import sys

    if "prometheus_client" in sys.modules:
        return
    hide = "snappy" not in sys.modules
    if hide:
        sys.modules["snappy"] = None  # `import snappy` raises ImportError while prometheus_client loads
    try:
        import prometheus_client  # noqa: F401
    finally:
        if hide and "snappy" in sys.modules and sys.modules["snappy"] is None:
            del sys.modules["snappy"]


def serve(address: str, snapshot) -> MetricsServer:
    """Listen on ``address`` ("HOST:PORT"; port 0: any free port) and answer /metrics, /healthz
    and /status from ``snapshot()`` on a daemon thread. Raises ValueError (a bad address, or a
    host that does not resolve) or OSError (cannot listen there: in use, not ours), each with a
    one-line message naming the address."""
    from http.server import ThreadingHTTPServer

    _load_prometheus_client()
    family, sockaddr = _resolve(address)

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True
        block_on_close = False
        request_queue_size = 128  # (socketserver's 5 dropped a burst of scrapers: kernel retries 1-3 s later)

        def handle_error(self, request, client_address):  # never a traceback on stderr
            pass

    try:
        httpd = Server(sockaddr[:2], _handler(snapshot))
    except OSError as e:
        err = OSError(f"cannot listen on {address}: {e.strerror or e}")
        err.errno = e.errno
        raise err from None
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.25},
                              name=f"nsqcli-metrics {address}", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


def _resolve(address: str):
    """(address family, socket address) to listen on: IPv4 where the host has it."""
    import socket

    host, port = parse_address(address)
    try:
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                                   socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"metrics address {address!r}: host {host!r} not found ({e.strerror})") from None
    family, _, _, _, sockaddr = next((i for i in infos if i[0] == socket.AF_INET), infos[0])
    return family, sockaddr


def _handler(snapshot):
    """The request handler class: /metrics (the families of ``snapshot()``), /healthz, /status."""
    from http.server import BaseHTTPRequestHandler
    from urllib.parse import parse_qs, urlsplit

    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    class Collector:
        def describe(self):
            return []

        def collect(self):
            return families(snapshot())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())

    class Handler(BaseHTTPRequestHandler):
        server_version = f"nsqcli/{__version__}"
        timeout = REQUEST_TIMEOUT

        def log_message(self, format, *args):  # noqa: A002 - no line per request
            pass

        def do_GET(self):
            self._answer(head=False)

        def do_HEAD(self):
            self._answer(head=True)

        def _answer(self, head: bool) -> None:
            url = urlsplit(self.path)
            try:
                if url.path == "/metrics":
                    status, ctype, body = 200, CONTENT_TYPE_LATEST, generate_latest(registry)
                elif url.path == "/healthz":
                    status, ctype, body = _health(snapshot(), parse_qs(url.query).get("format") == ["json"])
                elif url.path == "/status":
                    status, ctype, body = 200, "application/json", json.dumps(snapshot()).encode() + b"\n"
                else:
                    status, ctype, body = 404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz or /status\n"
            except Exception as e:  # a snapshot that failed: say so, keep serving
                reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                status, ctype, body = 500, "text/plain; charset=utf-8", f"snapshot failed: {reason}\n".encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                if not head:
                    self.wfile.write(body)
            except OSError:  # the scraper went away
                pass

    return Handler


def _health(snap: dict, as_json: bool) -> tuple[int, str, bytes]:
    health = snap.get("health") or {}
    ok = bool(health.get("ok"))
    reason = " ".join(str(health.get("reason") or "").split()) or ("ok" if ok else "unhealthy")
    status = 200 if ok else 503
    if as_json:
        body = {"ok": ok, "reason": "" if ok and reason == "ok" else reason, "state": snap.get("state"),
                "uptime_seconds": snap.get("uptime_seconds")}
        return status, "application/json", json.dumps(body).encode() + b"\n"
    return status, "text/plain; charset=utf-8", ("ok\n" if ok else f"{reason}\n").encode()
