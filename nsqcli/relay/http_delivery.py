"""to-http's delivery: endpoints, the modes (hostpool, round-robin, fanout), and one I/O thread
that runs every exchange at once on non-blocking keep-alive connections.

A message is one *job*: ``Deliverer.submit(body, on_done)``; ``on_done(None)`` after a 2xx
answer to a POST (200 to a GET) from every endpoint the mode asks for, ``on_done(Failed)``
otherwise (with the Retry-After the endpoint sent, if any). The caller FINs or REQs.

Why one thread and a selector: with a thread per request in flight (100 threads, one blocking
HTTPConnection each) a delivery cost ~205 us of CPU, 120 of them in the kernel (GIL hand-offs,
socket timeouts' polls); multiplexed it costs ~22 us (measured side by side against nsqd's
/pub, 100 in flight: 5.2k vs 25.6k requests/s). Requests and answers are the project's one
HTTP client's (client/http.py: build_request, ResponseParser).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import selectors
import socket
import threading
import time
import urllib.parse

from ..client.http import ResponseError, ResponseParser, build_request

log = logging.getLogger("nsqcli.relay.http_delivery")

#: connects under way to one endpoint at once (see Deliverer._exchange)
MAX_CONNECTING = 4


class Endpoint:
    def __init__(self, method: str, url: str):
        self.method, self.url = method, url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid URL {url!r}: expected http(s)://HOST[:PORT]/PATH")
        if method == "GET" and url.count("%s") != 1:
            raise ValueError(f"a --get URL needs exactly one %s (replaced by the query-escaped body): {url!r}")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc.rpartition("@")[2]
        self.key = (self.scheme, self.host, self.port)
        if method == "POST":
            self.fixed_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def target(self, body: bytes) -> str:
        if self.method == "POST":
            return self.fixed_target
        url = self.url.replace("%s", urllib.parse.quote(body, safe=""))
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


class _Job:
    __slots__ = ("body", "on_done", "on_start", "token", "first", "tried", "left", "errors")

    def __init__(self, body: bytes, on_done, on_start, token):
        self.body, self.on_done, self.on_start, self.token = body, on_done, on_start, token
        self.first = self.tried = self.left = 0
        self.errors: list[Failed] = []


class _Conn:
    """One connection to an endpoint; at most one exchange on it at a time (no pipelining)."""

    __slots__ = ("ep", "sock", "state", "job", "out", "parser", "deadline", "connect_deadline")

    def __init__(self, ep: Endpoint, sock):
        self.ep, self.sock = ep, sock
        self.state = "connecting"  # -> ("handshake" ->) "idle" <-> "busy"
        self.job: _Job | None = None
        self.out = memoryview(b"")
        self.parser: ResponseParser | None = None
        self.deadline = self.connect_deadline = 0.0


class Deliverer:
    """Delivers bodies to the endpoints (per --mode), up to ``concurrency`` jobs at once, on
    keep-alive connections that one I/O thread multiplexes. ``submit`` from any thread;
    callbacks run on the I/O thread."""

    def __init__(self, endpoints: list[Endpoint], mode: str, headers: dict, content_type: str,
                 connect_timeout: float, timeout: float, concurrency: int = 100):
        self.endpoints, self.mode = endpoints, mode
        lines = "".join(f"{k}: {v}\r\n" for k, v in {"User-Agent": "nsqcli-to-http", **headers}.items())
        self.get_headers = lines
        self.post_headers = lines + f"Content-Type: {content_type}\r\n"
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self.concurrency = max(1, concurrency)
        self.next = 0  # hostpool: the endpoint in use; round-robin: the next one
        self._queue: collections.deque[_Job] = collections.deque()
        self._lock = threading.Lock()
        self._jobs = 0  # started and not done
        self._idle: dict[tuple, list[_Conn]] = {}
        self._busy: set[_Conn] = set()     # with an exchange
        self._opening: set[_Conn] = set()  # connecting (or TLS handshake), no exchange yet
        self._connecting: dict[tuple, int] = {}
        self._waiting: dict[tuple, collections.deque] = {}  # (job, deadline) for a connection
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closing = False
        self._tls = None
        self._thread = threading.Thread(target=self._run, name="nsqcli-http", daemon=True)
        self._thread.start()

    # -- any thread ---------------------------------------------------------------------------
    def submit(self, body: bytes, on_done, on_start=None, token=None) -> None:
        """Deliver ``body``; ``on_done(None or Failed)`` when done. ``on_start()`` is asked when
        the job's turn comes: False skips it (it is not delivered and on_done is not called).
        ``token``: what close() hands back if the job never started."""
        with self._lock:
            if self._closing:
                raise RuntimeError("deliverer closed")
            idle = not self._queue  # else the I/O thread has it to do, or is at --concurrency
            self._queue.append(_Job(body, on_done, on_start, token))
        if idle:
            self._wake()

    def close(self, timeout: float | None = None) -> list:
        """Finish the jobs started (each within its own --http-timeout), never start the ones
        still queued: their tokens are returned, for the caller to give back."""
        with self._lock:
            self._closing = True
            left = [j for j in self._queue]
            self._queue.clear()
        self._wake()
        self._thread.join(timeout)
        return [j.token for j in left]

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    # -- the I/O thread -------------------------------------------------------------------------
    def _run(self) -> None:
        sel = self._sel
        try:
            while True:
                self._start_jobs()
                with self._lock:
                    if self._closing and not self._jobs and not self._queue:
                        return
                wait = self._expire(time.monotonic())
                for key, events in sel.select(wait):
                    conn = key.data
                    if conn is None:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                        continue
                    self._ready(conn, events)
        finally:
            for conns in self._idle.values():
                for c in conns:
                    c.sock.close()
            for c in list(self._busy) + list(self._opening):
                c.sock.close()
            sel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _start_jobs(self) -> None:
        while self._jobs < self.concurrency:
            with self._lock:
                if not self._queue:
                    return
                job = self._queue.popleft()
            try:
                if job.on_start is not None and not job.on_start():
                    continue
            except Exception:
                log.exception("to-http: a delivery callback failed")
                continue
            self._jobs += 1
            eps = self.endpoints
            if self.mode == "fanout":
                job.left = len(eps)
                for ep in eps:
                    self._exchange(ep, job)
                continue
            job.first = self.next
            if self.mode == "round-robin":
                self.next = (self.next + 1) % len(eps)
            self._exchange(eps[job.first], job)

    def _exchange(self, ep: Endpoint, job: _Job) -> None:
        """One request of ``job`` to ``ep``: on an idle connection, else when a connection to
        ``ep`` is free or made. At most MAX_CONNECTING connects per endpoint at once: 100 at
        once overflow a small listen backlog (5 in Python's http.server), and the dropped SYNs
        come back only after a second or three - past --http-connect-timeout."""
        idle = self._idle.get(ep.key)
        if idle:
            self._begin(idle.pop(), job)
            return
        self._waiting.setdefault(ep.key, collections.deque()).append((job, time.monotonic() + self.timeout))
        self._more_connections(ep)

    def _more_connections(self, ep: Endpoint) -> None:
        waiting = self._waiting.get(ep.key)
        while waiting and self._connecting.get(ep.key, 0) < min(MAX_CONNECTING, len(waiting)):
            try:
                self._connect(ep, time.monotonic())
            except OSError as e:  # no connection to be had now: the oldest waiting job fails
                job, _ = waiting.popleft()
                self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {e.strerror or e}"))

    def _begin(self, conn: _Conn, job: _Job) -> None:
        ep = conn.ep
        conn.job = job
        conn.deadline = time.monotonic() + self.timeout
        post = ep.method == "POST"
        conn.out = memoryview(build_request(ep.method, ep.target(job.body), ep.host_header,
                                            job.body if post else None,
                                            self.post_headers if post else self.get_headers))
        conn.parser = ResponseParser(b"")
        conn.state = "busy"
        self._busy.add(conn)
        self._send(conn)

    def _usable(self, conn: _Conn) -> None:
        """A connection is free (connected, or done with an answer): the next waiting job for
        its endpoint, else idle."""
        waiting = self._waiting.get(conn.ep.key)
        if waiting:
            self._begin(conn, waiting.popleft()[0])
        else:
            conn.state = "idle"
            self._idle.setdefault(conn.ep.key, []).append(conn)

    def _connect(self, ep: Endpoint, now: float) -> _Conn:
        family, kind, proto, _, addr = socket.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex(addr)
            if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raise OSError(err, os.strerror(err))
        except BaseException:
            sock.close()
            raise
        conn = _Conn(ep, sock)
        conn.connect_deadline = now + min(self.connect_timeout, self.timeout)
        self._connecting[ep.key] = self._connecting.get(ep.key, 0) + 1
        self._opening.add(conn)
        self._sel.register(sock, selectors.EVENT_WRITE, conn)
        return conn

    def _connected(self, conn: _Conn) -> None:
        self._opening.discard(conn)
        self._connecting[conn.ep.key] -= 1
        self._usable(conn)
        self._more_connections(conn.ep)

    def _ready(self, conn: _Conn, events: int) -> None:
        try:
            if conn.state == "connecting":
                err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
                if conn.ep.scheme == "https":
                    self._start_tls(conn)
                    return
                self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
                self._connected(conn)
                return
            if conn.state == "handshake":
                self._handshake(conn)
                return
            if events & selectors.EVENT_WRITE and conn.out:
                self._send(conn)
            if events & selectors.EVENT_READ:
                self._read(conn)
        except ResponseError as e:
            self._fail(conn, str(e))
        except OSError as e:
            self._fail(conn, getattr(e, "strerror", None) or str(e))

    def _start_tls(self, conn: _Conn) -> None:
        import ssl

        if self._tls is None:
            self._tls = ssl.create_default_context()
        conn.sock = self._tls.wrap_socket(conn.sock, server_hostname=conn.ep.host, do_handshake_on_connect=False)
        conn.state = "handshake"
        self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        self._handshake(conn)

    def _handshake(self, conn: _Conn) -> None:
        import ssl

        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        self._connected(conn)

    def _send(self, conn: _Conn) -> None:
        import ssl

        while conn.out:
            try:
                n = conn.sock.send(conn.out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                return
            conn.out = conn.out[n:]
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        import ssl

        sock = conn.sock
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            if conn.parser is None:  # idle: the server closed it (or sent what nobody asked)
                self._drop(conn)
                return
            if conn.parser.feed(data):
                self._done(conn)
                return
            if not data:  # closed; feed raised if the answer was not complete
                return
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                return

    def _done(self, conn: _Conn) -> None:
        p, ep, job = conn.parser, conn.ep, conn.job
        conn.parser, conn.job = None, None
        self._busy.discard(conn)
        if p.headers.get("connection", "").lower() == "close" or p.rest:
            self._drop(conn)
            self._more_connections(ep)
        else:
            self._usable(conn)
        post = ep.method == "POST"
        ok = 200 <= p.status < 300 if post else p.status == 200
        error = None if ok else Failed(f"{ep.method} {ep.url}: HTTP {p.status} {p.reason}",
                                       _retry_after(p.headers.get("retry-after")))
        self._answered(ep, job, error)

    def _fail(self, conn: _Conn, what: str) -> None:
        """The connection is done for: its job fails - or, while it was being made for the jobs
        waiting, the oldest of them (each attempt at a dead endpoint gets its own error)."""
        job, ep = conn.job, conn.ep
        opening = conn in self._opening
        self._drop(conn)
        if job is None and opening:
            waiting = self._waiting.get(ep.key)
            if waiting:
                job = waiting.popleft()[0]
        if job is not None:
            self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {what}"))
        self._more_connections(ep)

    def _drop(self, conn: _Conn) -> None:
        if conn in self._opening:
            self._opening.discard(conn)
            self._connecting[conn.ep.key] -= 1
        self._busy.discard(conn)
        idle = self._idle.get(conn.ep.key)
        if idle and conn in idle:
            idle.remove(conn)
        conn.parser = conn.job = None
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _expire(self, now: float) -> float:
        """Fail the exchanges, connects and waits past their deadline; seconds until the next
        one (at most 1)."""
        wait = 1.0
        for conn in list(self._opening):
            if now >= conn.connect_deadline:
                self._fail(conn, "timed out")
            else:
                wait = min(wait, conn.connect_deadline - now)
        for conn in list(self._busy):
            if now >= conn.deadline:
                self._fail(conn, "timed out")
            else:
                wait = min(wait, conn.deadline - now)
        for key, waiting in self._waiting.items():
            while waiting and now >= waiting[0][1]:
                job, _ = waiting.popleft()
                ep = next(e for e in self.endpoints if e.key == key)
                self._answered(ep, job, Failed(f"{ep.method} {ep.url}: timed out (no connection)"))
            if waiting:
                wait = min(wait, waiting[0][1] - now)
        return max(0.0, wait)

    def _answered(self, ep: Endpoint, job: _Job, error: Failed | None) -> None:
        """One endpoint's answer for ``job``: the next endpoint, or the job is done."""
        eps = self.endpoints
        if self.mode == "fanout":
            if error is not None:
                job.errors.append(error)
            job.left -= 1
            if job.left:
                return
            errors = job.errors
            error = None if not errors else Failed(
                "; ".join(map(str, errors)), max((e.retry_after or 0 for e in errors), default=None) or None)
        elif error is not None:
            job.tried += 1
            # hostpool/round-robin: the next endpoint - unless this one asked us to wait (do not
            # hammer the others meanwhile) or every one failed
            if error.retry_after is None and job.tried < len(eps):
                self._exchange(eps[(job.first + job.tried) % len(eps)], job)
                return
        elif self.mode == "hostpool" and job.tried:
            self.next = (job.first + job.tried) % len(eps)
        self._jobs -= 1
        try:
            job.on_done(error)
        except Exception:  # the caller's bug must not stop every delivery
            log.exception("to-http: a delivery callback failed")
