"""The project's one HTTP client: ``HTTPConnection`` (HTTP/1.1, kept alive, total deadlines)
and its response reader, used by to-http's delivery (nsqcli.relay) and, one request per
connection, by the nsqlookupd and nsqd helpers here (v1 JSON, and the pre-1.0
status_code/data envelope).

Addresses may be ``host:port`` or a URL (``http://host:port[/path]``, ``https://...``): the
scheme is kept end to end. HTTPS is verified with the context :func:`configure_tls` set up once
per run from the command's --tls-ca-file/--tls-cert/--tls-key (the system CAs otherwise). An nsqd
started with --tls-required answers plain HTTP with 403 TLS_REQUIRED and its HTTPS port: the
nsqd helpers then ask https://HOST:HTTPS_PORT instead, within the same deadline. Every failure
of the nsqlookupd/nsqd helpers raises LookupdError(endpoint, status) with the server's message
when it sent one (a TLS failure: its cause and fix).
"""

from __future__ import annotations

import json
import sys
import urllib.parse

from ..errors import LookupdError
from .record import Record

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

#: the TLSConfig https:// requests are verified with (configure_tls); None: the system CAs
_tls_cfg = None


def configure_tls(cfg) -> None:
    """Verify every https:// request of this run with ``cfg`` (a TLSConfig: CA file, client
    certificate and key, insecure_skip_verify); the context is built once, now, so a CA file
    that does not load is said before any request (ConnectError)."""
    global _tls_cfg
    from .transport import ssl_context

    ssl_context(cfg)
    _tls_cfg = cfg


def https_context():
    """The SSLContext for https:// requests (see configure_tls)."""
    from .config import TLSConfig
    from .transport import ssl_context

    return ssl_context(_tls_cfg if _tls_cfg is not None else TLSConfig())


def seconds(t: float) -> str:
    """A duration for a message: '2s', '0.25s' (not '1.99935s')."""
    return f"{t:.2g}s" if t < 10 else f"{t:.0f}s"


def http_json(address: str, path: str, params: dict | None = None, timeout: float = 5.0,
              method: str = "GET", body: bytes | None = None):
    """Request ``path`` on ``address`` and return the decoded JSON (unwrapping old envelopes).

    ``timeout`` is a deadline for the whole request - connect, send, every byte of the answer -
    so a server that trickles its answer cannot hold the caller longer than that."""
    import time

    end = time.monotonic() + timeout
    url = base_url(address) + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    status, headers, raw = _request(url, method, body, timeout)
    https = _tls_required(status, raw, url)
    if https:  # nsqd --tls-required: the same request on its HTTPS port, in the time left
        url = https + url[len(base_url(address)):]
        left = end - time.monotonic()
        if left <= 0:
            raise LookupdError(f"no complete answer within {seconds(timeout)} (slow to answer)", url)
        status, headers, raw = _request(url, method, body, left)
    if status >= 400:
        raise LookupdError(_error_message(status, raw, url), url, status)
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


def _tls_required(status: int, raw: bytes, url: str) -> str | None:
    """https://HOST:PORT when an http:// request got nsqd's 403 TLS_REQUIRED naming its HTTPS port."""
    if status != 403 or not url.startswith("http://") or b"TLS_REQUIRED" not in raw[:200]:
        return None
    try:
        port = int(json.loads(raw)["https_port"])
    except (ValueError, KeyError, TypeError):
        return None
    host = urllib.parse.urlsplit(url).hostname or ""
    return f"https://{'[' + host + ']' if ':' in host else host}:{port}"


def tls_required_port(status: int, raw: bytes) -> int | None:
    """nsqd's HTTPS port when an answer is its 403 TLS_REQUIRED (nsqd --tls-required), else None."""
    found = _tls_required(status, raw, "http://x")
    return int(found.rsplit(":", 1)[1]) if found else None


def http_get(address: str, path: str, params: dict | None = None, timeout: float = 5.0
             ) -> tuple[int, dict, bytes]:
    """GET ``path``: (status, lower-cased headers, body), under the same total deadline."""
    url = base_url(address) + path + ("?" + urllib.parse.urlencode(params) if params else "")
    return _request(url, "GET", None, timeout)


def _request(url: str, method: str, body: bytes | None, timeout: float) -> tuple[int, dict, bytes]:
    """One exchange on a connection of its own (closed after the answer) under a total deadline."""
    import time

    parts = urllib.parse.urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = HTTPConnection(parts.scheme, parts.hostname, parts.port, parts.netloc)
    t0 = time.monotonic()
    try:
        status, _, headers, payload = conn.request(method, target, t0 + timeout, body or b"", _ONE_SHOT)
    except TimeoutError:
        raise LookupdError(f"no complete answer within {seconds(timeout)} (slow to answer)", url) from None
    except ResponseError as e:
        took = time.monotonic() - t0
        raise LookupdError(f"{e} ({took:.1f}s after the request)" if took >= 1 else str(e), url) from None
    except OSError as e:
        ssl = sys.modules.get("ssl")
        if ssl is not None and isinstance(e, ssl.SSLError) and not isinstance(e, ssl.SSLEOFError):
            from .config import TLSConfig
            from .transport import tls_failure

            cause, fix = tls_failure(e, _tls_cfg or TLSConfig(), "the server")
            if not fix and "did not answer in TLS" in cause:
                fix = f"it speaks plain HTTP: use {'http://' + url.split('://', 1)[1].split('/', 1)[0]}"
            raise LookupdError(f"{cause}: {fix}" if fix else cause, url) from None
        raise LookupdError(f"unreachable ({e.strerror or e})", url) from None
    finally:
        conn.close()
    return status, headers, payload


_ONE_SHOT = f"Accept: {ACCEPT}\r\nUser-Agent: nsqcli\r\nConnection: close\r\n"
#: the most an answer's head (status line and headers) may be
MAX_HEAD = 1 << 20


class ResponseError(ValueError):
    """What the server sent is not a complete HTTP answer (or is larger than allowed)."""


class HTTPConnection:
    """One HTTP/1.1 connection to ``scheme://host:port`` (TLS for https), opened on first use
    and kept alive between requests. After any failure, or an answer with ``Connection:
    close``, it is closed; the next request opens a new one. One thread at a time."""

    def __init__(self, scheme: str, host: str, port: int | None = None, host_header: str | None = None,
                 connect_timeout: float | None = None, max_size: int = MAX_RESPONSE, ssl_context=None):
        self.ssl_context = ssl_context  # https: None = https_context()
        self.scheme, self.host = scheme, host
        self.port = port or (443 if scheme == "https" else 80)
        self.host_header = host_header or host
        self.connect_timeout, self.max_size = connect_timeout, max_size
        self.sock = None
        self.buf = b""  # bytes received after the last answer

    def request(self, method: str, target: str, deadline: float, body: bytes | None = None,
                headers: str = "") -> tuple[int, str, dict, bytes]:
        """Send one request (``headers``: ready-made "Key: value\\r\\n" lines; Content-Length
        is added when there is a ``body``) and read its answer, all before ``deadline``
        (time.monotonic()). Returns (status, reason, lower-cased headers, body). Raises
        TimeoutError, OSError or ResponseError."""
        import time

        data = build_request(method, target, self.host_header, body, headers)
        try:
            if self.sock is None:
                self._connect(deadline)
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            self.sock.sendall(data)
            status, reason, answer_headers, payload, self.buf = read_response(self.sock, self.buf, deadline,
                                                                              self.max_size)
        except BaseException:
            self.close()
            raise
        if answer_headers.get("connection", "").lower() == "close":
            self.close()
        return status, reason, answer_headers, payload

    def _connect(self, deadline: float) -> None:
        import socket
        import time

        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        timeout = left if self.connect_timeout is None else min(left, self.connect_timeout)
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.scheme == "https":
                ctx = self.ssl_context or https_context()
                sock = ctx.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock, self.buf = sock, b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""


def _recv(sock, deadline: float) -> bytes:
    """The next bytes (b"" when the server closed), or TimeoutError past ``deadline``."""
    import time

    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)
    return sock.recv(65536)


def _not_http(buf: bytes) -> ResponseError:
    return ResponseError(f"not an HTTP answer: {buf[:40]!r} (is this the HTTP port?)")


def build_request(method: str, target: str, host_header: str, body: bytes | None, headers: str) -> bytes:
    """One HTTP/1.1 request (``headers``: ready-made "Key: value\r\n" lines; Content-Length
    is added when there is a ``body``)."""
    head = f"{method} {target} HTTP/1.1\r\nHost: {host_header}\r\n{headers}"
    if body is not None:
        head += f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode("latin-1") + (body or b"")


class ResponseParser:
    """One HTTP/1.x answer from bytes fed in any split - no I/O, so the blocking
    HTTPConnection and to-http's multiplexed connections read answers the same way.

    ``feed(data)`` (``data`` b"": the server closed) returns True once the answer is complete;
    then ``status``, ``reason``, ``headers`` (lower-cased names), ``body`` and ``rest`` (bytes
    after it, for the next answer) are set. The body is framed by Content-Length, chunked
    encoding or the server closing (then headers["connection"] is "close"). Garbage is refused
    at once, not when more data comes. Raises ResponseError for what is not a complete answer
    of at most ``max_size`` bytes. (No email parser: http.client's cost to-http ~250 us of CPU
    per message.)"""

    __slots__ = ("max_size", "buf", "status", "reason", "headers", "body", "rest", "_frame", "_need",
                 "_chunks", "_size")

    def __init__(self, buf: bytes = b"", max_size: int = MAX_RESPONSE):
        self.max_size = max_size
        self.buf = buf
        self.status, self.reason, self.headers, self.body, self.rest = 0, "", {}, b"", b""
        self._frame = None  # None: reading the head; then "length", "chunked" or "close"
        self._need = 0
        self._chunks: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> bool:
        closed = not data
        self.buf += data
        while self._frame is None:
            if not self._head(closed):
                return False
            if 100 <= self.status < 200 and self.status != 101:  # 100 Continue & co: the answer follows
                self._frame, self.headers = None, {}
                if closed and not self.buf:
                    raise ResponseError("the server closed the connection after an interim answer")
        if self._frame == "length":
            if len(self.buf) < self._need:
                if closed:
                    raise ResponseError(f"answer cut short ({len(self.buf)} of {self._need} bytes)")
                return False
            self.body, self.rest = self.buf[:self._need], self.buf[self._need:]
            return True
        if self._frame == "close":
            if len(self.buf) > self.max_size:
                raise ResponseError(f"answer larger than {self.max_size} bytes")
            if not closed:
                return False
            self.body, self.rest = self.buf, b""
            return True
        if self._frame == "chunked":
            return self._chunked(closed)
        return True  # no body

    def _head(self, closed: bool) -> bool:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if not b"HTTP/".startswith(buf[:5]):
                raise _not_http(buf)
            if len(buf) > MAX_HEAD:
                raise ResponseError("answer head over 1 MiB")
            if closed:
                if buf.startswith(b"HTTP/"):  # an answer that began: cut short, not a wrong port
                    raise ResponseError(f"answer cut short (the server closed after {len(buf)} bytes of its head)")
                raise _not_http(buf) if buf else ResponseError("the server closed the connection before answering")
            return False
        lines = buf[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise _not_http(buf)
        headers = self.headers
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        self.status, self.reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
        if parts[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"  # HTTP/1.0 closes after the answer unless it says otherwise
        self.buf = buf[end + 4:]
        if self.status in (204, 304) or 100 <= self.status < 200:
            self._frame, self.rest = "none", self.buf
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._frame = "chunked"
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise ResponseError(f"bad Content-Length {length[:20]!r}")
            self._need = int(length)
            if self._need > self.max_size:
                raise ResponseError(f"answer larger than {self.max_size} bytes")
            self._frame = "length"
        else:  # the body ends when the server closes: read it, and the connection is done
            headers["connection"] = "close"
            self._frame = "close"
        return True

    def _chunked(self, closed: bool) -> bool:
        """Chunk-size line, data, CRLF ... until a 0-size chunk and its (ignored) trailer."""
        while True:
            buf = self.buf
            if self._need < 0:  # after the last chunk: the trailer, up to an empty line
                if buf.startswith(b"\r\n") or b"\r\n\r\n" in buf:
                    self.rest = buf[2:] if buf.startswith(b"\r\n") else buf.partition(b"\r\n\r\n")[2]
                    self.body = b"".join(self._chunks)
                    return True
                break
            if self._need == 0:  # a size line
                if b"\r\n" not in buf:
                    break
                size_line, _, self.buf = buf.partition(b"\r\n")
                try:
                    n = int(size_line.split(b";")[0] or b"0", 16)
                except ValueError:
                    raise ResponseError(f"bad chunk size {size_line[:20]!r}") from None
                if n == 0:
                    self._need = -1
                    continue
                self._size += n
                if self._size > self.max_size:
                    raise ResponseError(f"answer larger than {self.max_size} bytes")
                self._need = n + 2
                continue
            if len(buf) < self._need:
                break
            self._chunks.append(buf[:self._need - 2])
            self.buf = buf[self._need:]
            self._need = 0
        if closed:
            raise ResponseError("answer cut short (chunked body)")
        return False


def read_response(sock, buf: bytes, deadline: float, max_size: int = MAX_RESPONSE
                  ) -> tuple[int, str, dict, bytes, bytes]:
    """One HTTP/1.x answer read from ``sock``, ``buf`` being what was received after the one
    before: (status, reason, lower-cased headers, body, the bytes left over for the next).
    See ResponseParser. Raises TimeoutError past ``deadline``."""
    p = ResponseParser(b"", max_size)
    done = p.feed(buf) if buf else False
    while not done:
        done = p.feed(_recv(sock, deadline))
    return p.status, p.reason, p.headers, p.body, p.rest


def _error_message(status: int, raw: bytes, url: str = "") -> str:
    try:
        msg = json.loads(raw).get("message") or raw.decode()
    except (ValueError, AttributeError):
        msg = raw.decode("utf-8", "replace").strip()[:200]
    text = f"HTTP {status} {msg}".rstrip()
    if status == 400 and b"HTTP request to an HTTPS server" in raw[:200] and url.startswith("http://"):
        text += f" (an HTTPS port: use {'https://' + url[len('http://'):].split('/', 1)[0]})"
    elif status == 403 and msg == "TLS_REQUIRED":
        text += " (this nsqd requires TLS for its HTTP API: give its https://HOST:HTTPS_PORT)"
    return text


class NsqdNode(Record, frozen=True):
    """An nsqd as nsqlookupd reports it (one of the "producers" of its /lookup and /nodes; not a
    publisher: that is nsqcli.client.producer.Producer)."""

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
    def from_json(cls, p: dict) -> "NsqdNode":
        if not isinstance(p.get("broadcast_address"), str):
            raise TypeError(f"broadcast_address is {p.get('broadcast_address')!r}")
        return cls(p["broadcast_address"], int(p["tcp_port"]), int(p["http_port"]),
                   str(p.get("hostname", "")), str(p.get("version", "")))


def lookup_topic(address: str, topic: str, timeout: float = 5.0) -> list[NsqdNode]:
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
        return [NsqdNode.from_json(p) for p in (data or {}).get("producers") or []]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise LookupdError(f"unexpected /lookup answer ({type(e).__name__}: {e}): {str(data)[:80]}",
                           base_url(address) + "/lookup") from None


def lookup_all(addresses: list[str], topic: str, timeout: float = 5.0, cancel=None
               ) -> tuple[list[NsqdNode], list[LookupdError]]:
    """Ask EVERY lookupd at once (one ``timeout`` for them all); union the producers by tcp
    address, in the order of ``addresses``. Returns (producers, errors). ``cancel``: ask_all's."""
    seen: dict[str, NsqdNode] = {}
    errors: list[LookupdError] = []
    for a in ask_http(addresses, lambda address: lookup_topic(address, topic, timeout), timeout, cancel):
        if a.error is not None:
            errors.append(a.error)
            continue
        for p in a.value:
            seen.setdefault(p.tcp_address, p)
    return list(seen.values()), errors


def ask_http(addresses: list[str], fn, timeout: float, cancel=None) -> list:
    """``fn(address)`` for every nsqlookupd or nsqd HTTP address at once, in one round of
    ``timeout`` (nsqcli.client.fanout.ask_all): one Answer per address, in order. Each failure -
    a LookupdError from ``fn``, or no answer by the round's end - is a LookupdError naming the
    address; any other exception is raised."""
    from .fanout import ask_all  # here, not at the top: `nsqcli pub` imports this module

    answers = ask_all(addresses, fn, timeout, catch=LookupdError, name=base_url, cancel=cancel)
    for a in answers:
        if a.error is not None and not isinstance(a.error, LookupdError):  # the round's Timeout
            a.error = LookupdError(a.error.reason, a.error.address)
    return answers


# -- the cluster as every nsqlookupd sees it (nsqcli lookup) --------------------------------------
class Node(Record):
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
        return NsqdNode(self.broadcast_address, self.tcp_port, self.http_port).tcp_address

    @property
    def http_address(self) -> str:
        return NsqdNode(self.broadcast_address, self.tcp_port, self.http_port).http_address

    def to_json(self) -> dict:
        return {"broadcast_address": self.broadcast_address, "hostname": self.hostname,
                "tcp_port": self.tcp_port, "http_port": self.http_port, "version": self.version,
                "tcp_address": self.tcp_address, "http_address": self.http_address,
                "topics": [{"topic": t, "tombstoned": tomb} for t, tomb in sorted(self.topics.items())],
                "lookupds": self.lookupds}


class ClusterView(Record):
    """The union of what every reachable nsqlookupd said."""

    nodes: dict[str, Node]            # tcp address -> node
    topics: dict[str, set[str]]       # topic -> channels
    errors: list[LookupdError]
    answered: list[str]

    def producers(self, topic: str) -> list[Node]:
        return [n for n in self.nodes.values() if topic in n.topics]


def _lookupd_view(address: str, topic: str | None, timeout: float) -> tuple[list, dict[str, list[str]]]:
    """One lookupd's nodes [(NsqdNode, [(topic, tombstoned)])] and channels {topic: [channel]},
    its requests all within ``timeout``. An answer of the wrong shape is a LookupdError, like
    an unreachable lookupd."""
    import time

    end = time.monotonic() + timeout

    def get(path, params=None):
        left = end - time.monotonic()
        if left <= 0:
            raise LookupdError(f"no complete answer within {timeout:g}s (slow to answer)", base_url(address))
        data = http_json(address, path, params, left)
        if data is not None and not isinstance(data, dict):
            raise TypeError(f"{path} answered {str(data)[:60]!r}, not a JSON object")
        return data or {}

    try:
        nodes = []
        for p in get("/nodes").get("producers") or []:
            tombs = p.get("tombstones") or []
            topics = [(str(t), bool(i < len(tombs) and tombs[i])) for i, t in enumerate(p.get("topics") or [])]
            nodes.append((NsqdNode.from_json(p), topics))
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
    """Ask every lookupd at once (one ``timeout`` for them all) for /nodes and /topics (or just
    ``topic``) and the channels; union, in the order of ``addresses``."""
    view = ClusterView({}, {}, [], [])
    answers = ask_http(addresses, lambda address: _lookupd_view(address, topic, timeout), timeout)
    for address, a in zip(addresses, answers):
        if a.error is not None:
            view.errors.append(a.error)
            continue
        nodes, channels = a.value
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
