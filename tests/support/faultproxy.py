"""A tiny loopback TCP proxy that plays network faults a real nsqd cannot: latency, a trickle,
a cut after N bytes (toxiproxy's latency / slicer / limit_data, without toxiproxy).

    with FaultProxy(nsqd.tcp_address, latency=4.5) as p:      # every answer 4.5 s late
        run(["pub", ..., "--nsqd-tcp-address", p.address])

``latency``: seconds added to every chunk nsqd sends back (downstream, as toxiproxy's latency
toxic does by default). ``trickle``: seconds between the single bytes of nsqd's answers.
``limit``: after this many bytes from the client have been forwarded to nsqd, nothing more
reaches either side and both are reset 0.2 s later (nsqd acts on the whole commands it got;
its answers to them are lost - a cut with publishes in flight). ``stall_on``: once the
client has sent these bytes (b"PUB "), nsqd's answers are held back for good (nsqd got the
command and acted on it; the client never hears). ``cut_on``: the same, and both sides are reset
0.2 s later (a connection lost with the command in nsqd and its answer not back). Everything is threads on 127.0.0.1;
``close()`` ends them."""

from __future__ import annotations

import socket
import threading
import time


class FaultProxy:
    def __init__(self, upstream: str, latency: float = 0.0, trickle: float = 0.0, limit: int | None = None,
                 stall_on: bytes | None = None, cut_on: bytes | None = None):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.latency, self.trickle, self.limit, self.stall_on = latency, trickle, limit, stall_on
        self.cut_on = cut_on
        self.stalled = threading.Event()
        self.forwarded = 0  # bytes from clients to nsqd
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._closed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        for s in [self._listener] + self._socks:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._socks += [client, server]
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _cut(self, *socks) -> None:
        self.cuts += 1
        for s in socks:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()  # a reset: what the other side had not read yet is gone
            except OSError:
                pass

    def _up(self, client, server) -> None:
        """client -> nsqd, cut after ``limit`` bytes."""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    server.shutdown(socket.SHUT_WR)
                    return
                if self.limit is not None:
                    with self._lock:
                        room = self.limit - self.forwarded
                        data = data[:max(0, room)]
                        self.forwarded += len(data)
                    if len(data) >= room:
                        self.stalled.set()  # from now on nsqd's answers are lost
                    if data:
                        server.sendall(data)
                    if len(data) >= room:
                        time.sleep(0.2)  # nsqd reads what it got before the cut
                        self._cut(client, server)
                        return
                else:
                    if self.stall_on is not None and self.stall_on in data:
                        self.stalled.set()  # before nsqd can answer it
                    cut = self.cut_on is not None and self.cut_on in data
                    if cut:
                        self.stalled.set()
                    self.forwarded += len(data)
                    server.sendall(data)
                    if cut:
                        time.sleep(0.2)  # nsqd acts on it; its answer is dropped
                        self._cut(client, server)
                        return
        except OSError:
            return

    def _down(self, server, client) -> None:
        """nsqd -> client, late or a byte at a time."""
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    client.shutdown(socket.SHUT_WR)
                    return
                if self.stalled.is_set():
                    continue  # read and dropped: the client hears nothing more
                if self.latency:
                    time.sleep(self.latency)  # chunk by chunk: answers keep their order
                if self.trickle:
                    for i in range(len(data)):
                        client.sendall(data[i:i + 1])
                        time.sleep(self.trickle)
                else:
                    client.sendall(data)
        except OSError:
            return
