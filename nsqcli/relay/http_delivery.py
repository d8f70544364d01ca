"""to-http's delivery: the modes (hostpool, round-robin, fanout) and one I/O thread that runs
every exchange at once on non-blocking keep-alive connections (the endpoints and what an answer
means: nsqcli.relay.endpoints).

A message is one *job*: ``Deliverer.submit(body, on_done)``; ``on_done(None)`` after a 2xx
answer to a POST (200 to a GET) from every endpoint the mode asks for, ``on_done(Failed)``
otherwise (with the Retry-After the endpoint sent, if any). The caller FINs or REQs.

Why one thread and a selector: a thread per request in flight (a blocking HTTPConnection each)
spends most of each delivery's CPU in the kernel, on GIL hand-offs among the threads and
socket timeouts' polls; one thread multiplexing every connection spends a fraction of it per
delivery (the figures: bench/figures.md). Requests and answers are the project's one HTTP
client's (client/http.py: build_request, ResponseParser).
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

from ..client.http import ResponseError, ResponseParser, build_request
from .endpoints import Endpoint, Failed, retry_after

log = logging.getLogger("nsqcli.relay.http_delivery")


#: connects under way to one endpoint at once (see Deliverer._exchange)
MAX_CONNECTING = 4
#: a connect that took this long, where the server's fastest took under FAST_CONNECT, had its
#: SYN dropped and sent again by the kernel (1 s later): the server's listen queue is full (see
#: Deliverer._timed)
SYN_RETRIED, FAST_CONNECT = 0.9, 0.2


class _Job:
    __slots__ = ("body", "on_done", "on_start", "token", "first", "tried", "left", "errors")

    def __init__(self, body: bytes, on_done, on_start, token):
        self.body, self.on_done, self.on_start, self.token = body, on_done, on_start, token
        self.first = self.tried = self.left = 0
        self.errors: list[Failed] = []


def _nothing_back(conn) -> bool:
    """Not one byte of an answer came on this exchange."""
    return conn.parser is not None and not conn.parser.buf and not conn.parser.status


class _Conn:
    """One connection to a server (scheme, host, port); at most one exchange on it at a time (no
    pipelining). Endpoints on the same server share connections: ``target`` is the endpoint of
    the exchange under way."""

    __slots__ = ("ep", "sock", "state", "job", "target", "out", "parser", "deadline", "connect_deadline",
                 "reused", "used", "reserved", "syn_at", "unserved", "addr")

    def __init__(self, ep: Endpoint, sock):
        self.ep, self.sock = ep, sock
        self.state = "connecting"  # -> ("handshake" ->) "idle" <-> "busy"
        self.job: _Job | None = None
        self.target: Endpoint | None = None
        self.out = memoryview(b"")
        self.parser: ResponseParser | None = None
        self.deadline = self.connect_deadline = 0.0
        self.reused = False  # the exchange under way is not the connection's first
        self.used = False
        self.reserved: tuple | None = None  # (job, endpoint, deadline) this new connection is for
        self.syn_at = 0.0  # when this connect's SYN went out
        self.unserved = False  # counted in Deliverer._unserved until its first answer
        self.addr: tuple | None = None  # getaddrinfo's answer: a connect made again is not looked up again


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
        self._best_connect: dict[tuple, float] = {}  # per server: its fastest connect (seconds)
        #: servers seen dropping SYNs (a full listen queue): their new connections count as
        #: connecting until their first answer, not only until the SYN-ACK (see _exchange)
        self._backlogged: set[tuple] = set()
        self._unserved: dict[tuple, int] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closing = False
        self._aborting: str | None = None  # abort(): why
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
        if not self._thread.is_alive():
            with self._lock:
                if self._wake_w >= 0:
                    os.close(self._wake_r)
                    os.close(self._wake_w)
                    self._wake_r = self._wake_w = -1
        return [j.token for j in left]

    def abort(self, why: str) -> None:
        """Give up every exchange under way (a deadline passed): each fails at once with
        Failed(``why``, abandoned=True) - it may have reached its server: at least once - and
        nothing new starts. Then close() hands back the jobs never started."""
        with self._lock:
            self._aborting = why
            self._closing = True
        self._wake()

    @property
    def finished(self) -> bool:
        """The I/O thread is done: every job that started was answered."""
        return not self._thread.is_alive()

    def _wake(self) -> None:
        with self._lock:
            if self._wake_w < 0:  # closed: the I/O thread is done
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # full: it is awake anyway
                pass

    # -- the I/O thread -------------------------------------------------------------------------
    def _run(self) -> None:
        sel = self._sel
        try:
            while True:
                try:
                    if self._aborting is not None:
                        self._abandon_all()
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
                except Exception:  # a bug: said, and the deliveries go on (a dead thread loses them all)
                    log.exception("to-http: unexpected error in the delivery loop")
                    time.sleep(0.01)
        finally:
            for conns in self._idle.values():
                for c in conns:
                    c.sock.close()
            for c in list(self._busy) + list(self._opening):
                c.sock.close()
            sel.close()  # the wake pipe: close() closes it once this thread is gone

    def _abandon_all(self) -> None:
        why = self._aborting
        for conn in list(self._busy) + list(self._opening):
            job, ep, reserved = conn.job if conn.parser is not None else None, conn.target or conn.ep, conn.reserved
            self._drop(conn)
            if job is None and reserved is not None:
                job, ep, _ = reserved
            if job is not None:
                self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {why}", abandoned=True))
        for waiting in list(self._waiting.values()):
            while waiting:
                job, ep, _ = waiting.popleft()
                self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {why}", abandoned=True))

    def _start_jobs(self) -> None:
        while self._jobs < self.concurrency and self._aborting is None:
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
        """One request of ``job`` to ``ep``, within --http-timeout from now (waiting for a
        connection included): on an idle connection to its server, else when one is free or
        made. At most MAX_CONNECTING connects per server at once: 100 at once overflow a small
        listen backlog (5 in Python's http.server), and the dropped SYNs come back only after a
        second or three - past --http-connect-timeout. Against a server that closes after each
        answer every request needs a connect, and the connected ones waiting in its listen
        queue (the kernel answers the SYN, the server accepts later) fill it all the same: once
        a server is seen dropping SYNs (_timed), its new connections count against
        MAX_CONNECTING until their first answer, so no more wait in its queue than it holds.
        (Making a slow connect again instead - a new SYN - broke servers a second away.)"""
        if self._aborting is not None:  # (a failover after abort())
            self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {self._aborting}", abandoned=True))
            return
        deadline = time.monotonic() + self.timeout
        idle = self._idle.get(ep.key)
        if idle:
            self._begin(idle.pop(), job, ep, deadline)
            return
        self._waiting.setdefault(ep.key, collections.deque()).append((job, ep, deadline))
        self._more_connections(ep.key)

    def _more_connections(self, key: tuple) -> None:
        waiting = self._waiting.get(key)
        while waiting and (self._connecting.get(key, 0) + self._unserved.get(key, 0)
                           < min(MAX_CONNECTING, len(waiting))):
            try:
                self._connect(waiting[0][1], time.monotonic())
            except OSError as e:  # no connection to be had now: the oldest waiting job fails
                job, ep, _ = waiting.popleft()
                self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {e.strerror or e}"))

    def _begin(self, conn: _Conn, job: _Job, ep: Endpoint, deadline: float) -> None:
        post = ep.method == "POST"
        try:
            request = build_request(ep.method, ep.target(job.body), ep.host_header, job.body if post else None,
                                    self.post_headers if post else self.get_headers)
        except (ValueError, UnicodeError) as e:  # this body cannot make a request (a GET URL)
            self._usable(conn)
            self._answered(ep, job, Failed(f"{ep.method} {ep.url}: cannot make the request: {e}"))
            return
        conn.reused, conn.used = conn.used, True
        conn.job, conn.target, conn.deadline = job, ep, deadline
        conn.out = memoryview(request)
        conn.parser = ResponseParser(b"")
        conn.state = "busy"
        self._busy.add(conn)
        self._send(conn)

    def _usable(self, conn: _Conn) -> None:
        """A connection is free (connected, or done with an answer): the next waiting job for
        its server, else idle."""
        waiting = self._waiting.get(conn.ep.key)
        if waiting:
            job, ep, deadline = waiting.popleft()
            self._begin(conn, job, ep, deadline)
        else:
            conn.state = "idle"
            self._idle.setdefault(conn.ep.key, []).append(conn)

    def _connect(self, ep: Endpoint, now: float) -> _Conn:
        conn = _Conn(ep, None)
        conn.sock = self._syn(ep, now, conn)
        conn.connect_deadline = now + min(self.connect_timeout, self.timeout)
        self._connecting[ep.key] = self._connecting.get(ep.key, 0) + 1
        self._opening.add(conn)
        self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)
        return conn

    def _syn(self, ep: Endpoint, now: float, conn: _Conn):
        """A non-blocking socket connecting to ``ep`` (its SYN is on the way), timed on ``conn``."""
        if conn.addr is None:
            conn.addr = socket.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)[0]
        family, kind, proto, _, addr = conn.addr
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
        conn.syn_at = now
        return sock

    def _timed(self, conn: _Conn, now: float) -> None:
        """A connect was answered. One that took a kernel SYN retransmission (~1 s) where the
        server's fastest took a few ms says its listen queue overflowed: it is backlogged from
        now on. A far server (every connect slow) never is."""
        key = conn.ep.key
        took = now - conn.syn_at
        best = self._best_connect.get(key)
        if best is None or took < best:
            self._best_connect[key] = took
        elif took >= SYN_RETRIED and best < FAST_CONNECT and key not in self._backlogged:
            self._backlogged.add(key)
            log.debug("%s:%s dropped a SYN (connect took %.2fs, its fastest %.4fs): at most %d new "
                      "connections waiting for its answer", key[1], key[2], took, best, MAX_CONNECTING)

    def _served(self, conn: _Conn) -> None:
        """A new connection of a backlogged server got its first answer (or ended): the server
        has taken it off its listen queue."""
        if conn.unserved:
            conn.unserved = False
            self._unserved[conn.ep.key] -= 1

    def _connected(self, conn: _Conn) -> None:
        self._opening.discard(conn)
        self._connecting[conn.ep.key] -= 1
        if conn.ep.key in self._backlogged:
            conn.unserved = True
            self._unserved[conn.ep.key] = self._unserved.get(conn.ep.key, 0) + 1
        if conn.reserved is not None:
            reserved, conn.reserved = conn.reserved, None
            self._begin(conn, *reserved)
        else:
            self._usable(conn)
        self._more_connections(conn.ep.key)

    def _ready(self, conn: _Conn, events: int) -> None:
        try:
            if conn.state == "connecting":
                err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
                self._timed(conn, time.monotonic())
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
                if conn.parser is None:  # it failed
                    return
            if events & selectors.EVENT_READ:
                self._read(conn)
        except ResponseError as e:
            self._fail(conn, str(e), closed=_nothing_back(conn))
        except OSError as e:
            self._fail(conn, getattr(e, "strerror", None) or str(e), closed=_nothing_back(conn))

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
        """Write what is left of the request; a failure fails the exchange (never raises)."""
        import ssl

        try:
            while conn.out:
                try:
                    n = conn.sock.send(conn.out)
                except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                    return
                conn.out = conn.out[n:]
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        except OSError as e:
            self._fail(conn, getattr(e, "strerror", None) or str(e), closed=_nothing_back(conn))

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
        """An answer came: the job first (so nothing done with the connection can lose it),
        then the connection is reused - unless the server closes it, sent more than the answer,
        or answered before the whole request was sent."""
        p, job, ep = conn.parser, conn.job, conn.target
        self._served(conn)
        reuse = not (p.headers.get("connection", "").lower() == "close" or p.rest or conn.out)
        conn.parser = conn.job = conn.target = None
        self._busy.discard(conn)
        post = ep.method == "POST"
        ok = 200 <= p.status < 300 if post else p.status == 200
        self._answered(ep, job, None if ok else Failed(f"{ep.method} {ep.url}: HTTP {p.status} {p.reason}",
                                                       retry_after(p.headers.get("retry-after"))))
        if reuse:
            self._usable(conn)
        else:
            self._drop(conn)
        self._more_connections(conn.ep.key)  # (a backlogged server just took one off its queue)

    def _fail(self, conn: _Conn, what: str, closed: bool = False) -> None:
        """The connection is done for: its exchange fails - or, while it was being made for the
        jobs waiting, the oldest of them (each attempt at a dead server gets its own error).
        ``closed``: the server closed or reset it before any answer. On a kept-alive connection
        that is the race of a server closing it while idle: the request goes once more on a new
        connection (at least once: the server may have taken it)."""
        job, ep = conn.job, conn.target or conn.ep
        if conn.parser is None:
            job = None  # no exchange under way (idle, or already answered)
        opening = conn in self._opening
        # (the resend goes on a new connection, whose first request is never resent: at most
        # once per request - per endpoint of a fanout, not once per message)
        resend = closed and conn.reused and job is not None
        self._drop(conn)
        if job is None and opening:
            if conn.reserved is not None:
                job, ep, _ = conn.reserved
            else:
                waiting = self._waiting.get(conn.ep.key)
                if waiting:
                    job, ep, _ = waiting.popleft()
        if job is not None:
            if resend:  # on a connection of its own: an idle one may be just as stale
                try:
                    self._connect(ep, time.monotonic()).reserved = (job, ep, time.monotonic() + self.timeout)
                except OSError as e:
                    self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {e.strerror or e}"))
            else:
                self._answered(ep, job, Failed(f"{ep.method} {ep.url}: {what}"))
        self._more_connections(conn.ep.key)

    def _drop(self, conn: _Conn) -> None:
        self._served(conn)
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
                self._fail(conn, "timed out (connecting)")
                continue
            wait = min(wait, conn.connect_deadline - now)
        for conn in list(self._busy):
            if now >= conn.deadline:
                self._fail(conn, "timed out")
            else:
                wait = min(wait, conn.deadline - now)
        for waiting in list(self._waiting.values()):  # a failover below may add a server
            while waiting and now >= waiting[0][2]:
                job, ep, _ = waiting.popleft()
                self._answered(ep, job, Failed(f"{ep.method} {ep.url}: timed out (no connection)"))
            if waiting:
                wait = min(wait, waiting[0][2] - now)
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
                "; ".join(map(str, errors)), max((e.retry_after or 0 for e in errors), default=None) or None,
                any(e.abandoned for e in errors))
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
