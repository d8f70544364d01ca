"""Port forwards on two side-by-side loopback ports, as a router or ``ssh -L`` would make them:
``port`` to one upstream and ``port + 1`` to another - so that "the HTTP port is the TCP port + 1"
points at whatever the second forward reaches (another nsqd, say).

    with PortPair(x.tcp_address, y.http_address) as p:   # p.address: 127.0.0.1:P -> x's TCP
        run(["tail", "-t", T, "--nsqd-tcp-address", p.address])   # P + 1 -> y's HTTP

Plain byte forwarding on daemon threads; ``close()`` ends the listeners and connections."""

from __future__ import annotations

import socket
import threading


class PortPair:
    def __init__(self, upstream: str, upstream_plus_one: str):
        self._socks: list[socket.socket] = []
        self._closed = False
        self._listeners = self._bind_pair()
        self.port = self._listeners[0].getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        for listener, up in zip(self._listeners, (upstream, upstream_plus_one)):
            host, port = up.rsplit(":", 1)
            threading.Thread(target=self._accept, args=(listener, (host, int(port))), daemon=True).start()

    @staticmethod
    def _bind_pair() -> tuple[socket.socket, socket.socket]:
        for _ in range(100):
            a = socket.create_server(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port < 65535:
                try:
                    return a, socket.create_server(("127.0.0.1", port + 1))
                except OSError:
                    pass
            a.close()
        raise RuntimeError("no two free ports side by side")

    def __enter__(self) -> "PortPair":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        for s in [*self._listeners, *self._socks]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self, listener: socket.socket, upstream: tuple[str, int]) -> None:
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._socks += [client, server]
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
