"""Certificates and an nsqd auth server for integration tests (real TLS, real HTTP)."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_cert(directory: Path, name: str = "server") -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1/localhost; returns (cert, key) paths."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


class AuthServer:
    """What nsqd's --auth-http-address calls: GET /auth?secret=...&remote_ip=...&tls=...

    ``grants`` maps a secret to a list of (topic regex, channel regexes, permissions); an
    unknown secret gets HTTP 403, which nsqd turns into E_AUTH_FAILED."""

    def __init__(self, grants: dict[str, list[tuple[str, list[str], list[str]]]]):
        self.grants = grants
        self.calls: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
                if url.path == "/auth" and "secret" in q:
                    # only nsqd's calls: under xdist another test's probe of a port it
                    # believed free can land here (CI on v1.2.1: a call with no secret)
                    outer.calls.append(q)
                grant = outer.grants.get(q.get("secret", ""))
                if grant is None:
                    self.send_response(403)
                    self.end_headers()
                    self.wfile.write(b"forbidden")
                    return
                body = json.dumps({"ttl": 3600, "identity": f"user-{q['secret']}",
                                   "identity_url": "", "authorizations": [
                                       {"topic": t, "channels": c, "permissions": p} for t, c, p in grant]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "AuthServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def default_layout_nsqd(base_dir, *flags: str):
    """A real nsqd laid out as nsqd's defaults are (HTTP port = TCP port + 1, as 4150/4151), with
    extra ``flags``, on a free pair of ports; a started sandbox (``.nsqd`` is the server; stop
    it with ``.stop()``). The sandbox's nsqd answers HTTP on any free port, which no client can
    find from the TCP address alone."""
    import socket

    from nsqcli.sandbox import NsqdOptions, Sandbox

    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        sb = Sandbox(NsqdOptions(extra_args=list(flags)), with_lookupd=False, base_dir=str(base_dir))
        ports = iter((port, port + 1))
        sb._addr = lambda: f"127.0.0.1:{next(ports)}"
        return sb.start()
    raise RuntimeError("no two free ports side by side")
