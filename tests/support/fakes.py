"""Scripted fake servers for the faults a real nsqd / nsqlookupd cannot produce on cue (go-nsq's
mock_test.go style), and a memory stream that feeds a Connection without a socket.

A FakeNsqd runs one script per accepted connection: a function ``script(peer)`` that reads the
client's commands (``peer.command()``) and answers with whatever it likes - garbage, wrong
types, silence, a trickle, a decompression bomb. Everything listens on 127.0.0.1 only and stops
with the test."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import urllib.parse
import zlib
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
PAYLOAD_COMMANDS = (b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB")


def frame(ftype: int, data: bytes) -> bytes:
    return struct.pack(">lL", len(data) + 4, ftype) + data


def message(body: bytes, msg_id: bytes = b"0123456789abcdef", attempts: int = 1) -> bytes:
    return frame(FRAME_MESSAGE, struct.pack(">qH16s", time.time_ns(), attempts, msg_id) + body)


class Peer:
    """The server side of one client connection."""

    def __init__(self, sock: socket.socket, server: "FakeNsqd"):
        self.sock = sock
        self.server = server
        self.buf = b""
        self.inflate: zlib._Decompress | None = None
        self.deflate: zlib._Compress | None = None

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        if self.inflate is not None:
            data = self.inflate.decompress(data)
        self.buf += data
        return True

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def magic(self) -> bytes:
        return self.read(4)

    def command(self) -> tuple[bytes, bytes]:
        """The next command: (line, payload or b"")."""
        while b"\n" not in self.buf:
            if not self._fill():
                raise EOFError
        line, self.buf = self.buf.split(b"\n", 1)
        payload = b""
        if line.split(b" ")[0] in PAYLOAD_COMMANDS:
            (size,) = struct.unpack(">l", self.read(4))
            payload = self.read(size)
        self.server.commands.append(line)
        return line, payload

    def until(self, prefix: bytes) -> tuple[bytes, bytes]:
        while True:
            line, payload = self.command()
            if line.startswith(prefix):
                return line, payload

    def send(self, data: bytes) -> None:
        if self.deflate is not None:
            data = self.deflate.compress(data) + self.deflate.flush(zlib.Z_SYNC_FLUSH)
        self.sock.sendall(data)

    def respond(self, data: bytes) -> None:
        self.send(frame(FRAME_RESPONSE, data))

    def error(self, data: bytes) -> None:
        self.send(frame(FRAME_ERROR, data))

    def identify(self, features: dict | None = None) -> dict:
        """Read magic + IDENTIFY; answer with ``features`` (JSON) or OK."""
        self.magic()
        _, payload = self.until(b"IDENTIFY")
        self.respond(b"OK" if features is None else json.dumps(features).encode())
        return json.loads(payload)

    def handshake(self) -> bytes:
        """A well-behaved handshake up to SUB/PUB; returns that command's line (unanswered)."""
        self.identify({"max_rdy_count": 2500, "version": "fake", "msg_timeout": 60000})
        line, _ = self.command()
        while line.startswith(b"AUTH") or line == b"NOP":
            line, _ = self.command()
        return line

    def silence(self, seconds: float = 30.0) -> None:
        self.server.stopped.wait(seconds)


class FakeNsqd:
    """A TCP server on 127.0.0.1 running ``script(peer)`` for every connection."""

    def __init__(self, script):
        self.script = script
        self.commands: list[bytes] = []
        self.connections = 0
        self.stopped = threading.Event()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._socks.append(sock)
            threading.Thread(target=self._run, args=(sock,), daemon=True).start()

    def _run(self, sock: socket.socket) -> None:
        try:
            self.script(Peer(sock, self))
        except (EOFError, OSError):
            pass
        finally:
            if not self.stopped.is_set():
                self.stopped.wait(0.2)  # let the client read what was sent before the FIN
            sock.close()

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> "FakeNsqd":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class FakeLookupd(FakeNsqd):
    """An HTTP "nsqlookupd" whose script answers (or not) every request: ``script(peer)``,
    where ``peer.request()`` reads the request line and headers."""


def http_request(peer: Peer) -> bytes:
    while b"\r\n\r\n" not in peer.buf:
        if not peer._fill():
            raise EOFError
    head, peer.buf = peer.buf.split(b"\r\n\r\n", 1)
    return head.split(b"\r\n")[0]


def http_answer(peer: Peer, status: int, body: bytes, content_type: str = "application/json") -> None:
    peer.send(b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
              % (status, content_type.encode(), len(body)) + body)


def lookupd_trickle(peer: Peer) -> None:
    """An HTTP server that sends its answer one byte a second."""
    http_request(peer)
    for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n":
        peer.sock.sendall(bytes([b]))
        if peer.server.stopped.wait(1.0):
            return


class MemoryStream:
    """The stream interface of nsqcli.client.transport.Stream, fed by a test instead of a socket.

    ``feed(bytes)`` makes data readable (``feed(None)``: the peer closed); ``sent`` collects
    what the Connection wrote. A pipe makes ``fileno()`` readable for the I/O thread's select()."""

    def __init__(self, address: str = "memory:1"):
        self.address = address
        self.sent = bytearray()
        self.tls_version = None
        self.compression = None
        self._chunks: deque = deque()
        self._cond = threading.Condition()
        self._r, self._w = os.pipe()
        self._timeout: float | None = None
        self.closed = False
        self.plain = True  # other threads may send_nowait (Connection._send_now)
        self.room: int | None = None  # bytes one send_nowait takes (None: all of them)

    @classmethod
    def dialer(cls, streams: list["MemoryStream"]):
        """A ``dial`` for Connection/Consumer/Producer handing out the given streams in turn."""
        def dial(address: str, timeout: float) -> "MemoryStream":
            stream = streams.pop(0)
            stream.address = address
            return stream
        return dial

    def feed(self, data: bytes | None) -> None:
        with self._cond:
            self._chunks.append(data)
            self._cond.notify_all()
        os.write(self._w, b"x")

    def wait_sent(self, needle: bytes, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.sent:
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} never sent; sent {bytes(self.sent)!r}")
            time.sleep(0.005)

    # -- the stream interface -----------------------------------------------------------------
    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def fileno(self) -> int:
        return self._r

    def pending(self) -> bool:
        return False

    def recv(self) -> bytes | None:
        from nsqcli.errors import Timeout

        with self._cond:
            if not self._cond.wait_for(lambda: self._chunks or self.closed, self._timeout):
                raise Timeout("read timed out", self.address)
            if self.closed and not self._chunks:
                return None
            data = self._chunks.popleft()
        try:
            os.read(self._r, 1)
        except OSError:
            pass
        return data

    def sendall(self, data: bytes) -> None:
        from nsqcli.errors import WriteError

        if self.closed:
            raise WriteError("closed", self.address)
        self._received(bytes(data))

    def send_nowait(self, data: bytes) -> int:
        from nsqcli.errors import WriteError

        if self.closed:
            raise WriteError("closed", self.address)
        n = len(data) if self.room is None else min(self.room, len(data))
        self._received(bytes(data[:n]))
        return n

    def _received(self, data: bytes) -> None:
        """What the "server" got (a subclass may parse and answer it)."""
        self.sent += data

    def encode(self, data: bytes) -> bytes:
        return data

    def start_tls(self, cfg) -> None:
        raise AssertionError("no TLS on a memory stream")

    def upgrade_compression(self, kind: str, level: int = 6) -> None:
        raise AssertionError("no compression on a memory stream")

    def decompress(self, data: bytes) -> bytes:
        return data

    def shutdown_write(self) -> None:
        pass

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1


class HTTPEndpoint:
    """A real local HTTP/1.1 server (keep-alive) that records every request; ``script(body, n)`` (n = how often this body came) returns
    (status, headers, delay seconds)."""

    def __init__(self, script=None, tls: tuple[str, str] | None = None, backlog: int = 5):
        self.script = script or (lambda body, n: (200, {}, 0))
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.command == "GET":
                    q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                    body = q.get("msg", [""])[0].encode("utf-8")
                with outer.lock:
                    n = sum(1 for r in outer.requests if r["body"] == body) + 1
                    outer.requests.append({"body": body, "method": self.command, "time": time.monotonic(),
                                           "headers": dict(self.headers), "path": self.path})
                status, headers, delay = outer.script(body, n)
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                payload = b"" if status in (204, 304) else b"ok"  # no body with 204 (HTTP)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _any

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = backlog  # http.server's listen backlog (5 by default)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:  # (cert, key): HTTPS
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, ok_only=False):
        return [r["body"] for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
