"""TLS failures name their cause and the fix (issue 33, part 6), and an nsqd whose HTTP API is
HTTPS only (--tls-required=true) can be monitored, administered and diagnosed - against real
nsqd v1.3.0 with a client-certificate policy, except the one fault v1.3.0 cannot play: a server
whose TLS stops at 1.2 (nsqd 1.2.1 and older), played by a socket server that answers IDENTIFY
as nsqd 1.2.1 does and then offers TLS 1.2 at most."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading

import pytest

from tests.support.fakes import FRAME_RESPONSE, frame
from tests.support.helpers import one_error_line, run_nsqcli
from tests.support.nsq_fixtures import make_cert


@pytest.fixture
def pki(tmp_path):
    """A server and a client certificate (self-signed), and a CA bundle holding both."""
    cert, key = make_cert(tmp_path, "server")
    client_cert, client_key = make_cert(tmp_path, "client")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(open(cert, "rb").read() + open(client_cert, "rb").read())
    return {"cert": cert, "key": key, "client_cert": client_cert, "client_key": client_key, "ca": str(ca)}


@pytest.fixture
def strict_nsqd(pki, tmp_path):
    """nsqd --tls-required=true --tls-client-auth-policy=require-verify: TCP only over TLS with a
    client certificate, the HTTP API only on HTTPS (plain HTTP answers 403 TLS_REQUIRED). Started
    here: the sandbox waits for a plain /ping, which this nsqd refuses."""
    import subprocess
    import time
    import urllib.error
    import urllib.request
    from types import SimpleNamespace

    from nsqcli.sandbox import find_binary, free_port

    tcp, http, https = (f"127.0.0.1:{free_port()}" for _ in range(3))
    data = tmp_path / "strict"
    data.mkdir()
    proc = subprocess.Popen([find_binary("nsqd"), f"--tcp-address={tcp}", f"--http-address={http}",
                             f"--https-address={https}", f"--data-path={data}", f"--tls-cert={pki['cert']}",
                             f"--tls-key={pki['key']}", f"--tls-root-ca-file={pki['ca']}",
                             "--tls-client-auth-policy=require-verify", "--tls-required=true"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://{http}/ping", timeout=0.5)
            except urllib.error.HTTPError as e:
                if e.code == 403:  # TLS_REQUIRED: up
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < end, "nsqd --tls-required=true did not start"
            time.sleep(0.05)
        yield SimpleNamespace(tcp_address=tcp, http_address=http, https_address=https, pki=pki)
    finally:
        proc.terminate()
        proc.wait(10)


def _https_stats(server, topic: str) -> dict | None:
    """The topic in nsqd's /stats, asked over HTTPS with the client certificate."""
    ctx = ssl.create_default_context(cafile=server.pki["ca"])
    ctx.load_cert_chain(server.pki["client_cert"], server.pki["client_key"])
    import urllib.request

    with urllib.request.urlopen(f"https://{server.https_address}/stats?format=json&topic={topic}",
                                context=ctx, timeout=5) as resp:
        topics = json.loads(resp.read())["topics"]
    return next((t for t in topics if t["topic_name"] == topic), None)


def _client_tls(pki) -> list[str]:
    return ["--tls-ca-file", pki["ca"], "--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"]]


# -- TCP: what the handshake failure says ----------------------------------------------------------
def test_a_missing_client_certificate_is_named_with_the_options_that_give_one(strict_nsqd, pki, topic):
    r = run_nsqcli(["pub", topic, "x", "--nsqd-tcp-address", strict_nsqd.tcp_address, "--tls-ca-file", pki["ca"]])
    line = one_error_line(r, 1, r"nsqd v1\.3\.0 requires a client certificate")
    assert "give --tls-cert FILE and --tls-key FILE" in line and "SSL:" not in line and "_ssl.c" not in line
    r = run_nsqcli(["pub", topic, "x", "--nsqd-tcp-address", strict_nsqd.tcp_address, *_client_tls(pki)])
    assert r.returncode == 0, r.stderr
    r = run_nsqcli(["pub", topic, "x", "--nsqd-tcp-address", strict_nsqd.tcp_address, "--tls"])
    one_error_line(r, 1, r"TLS certificate verification failed: self-signed certificate: give --tls-ca-file ")
    assert _https_stats(strict_nsqd, topic)["message_count"] == 1


@pytest.mark.parametrize("content, why", [(b"", "is empty"), (b"hello\n", "is not PEM")])
def test_a_ca_file_that_is_empty_or_not_pem_is_a_usage_error_naming_it(tmp_path, content, why):
    bad = tmp_path / "ca.pem"
    bad.write_bytes(content)
    for args in (["pub", "t", "x", "--nsqd-tcp-address", "127.0.0.1:1"],
                 ["stat", "-n", "1", "--nsqd-http-address", "https://127.0.0.1:1"]):
        r = run_nsqcli([*args, "--tls-ca-file", str(bad)])
        one_error_line(r, 2, rf"'--tls-ca-file': {bad} {why}")


def _tls12_nsqd(cert: str, key: str, version: str = "1.2.1"):
    """An nsqd <= 1.2.1 as the client meets it: IDENTIFY answered with tls_v1 and its version,
    then TLS up to 1.2 only. Returns (address, stop)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def read(conn, n):
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                conn.settimeout(5)
                read(conn, 4)  # "  V2"
                read(conn, len(b"IDENTIFY\n"))
                read(conn, struct.unpack(">l", read(conn, 4))[0])
                conn.sendall(frame(FRAME_RESPONSE, json.dumps({
                    "max_rdy_count": 2500, "version": version, "max_msg_timeout": 900000, "msg_timeout": 60000,
                    "tls_v1": True, "deflate": False, "deflate_level": 6, "max_deflate_level": 6, "snappy": False,
                    "sample_rate": 0, "auth_required": False, "output_buffer_size": 16384,
                    "output_buffer_timeout": 250}).encode()))
                ctx.wrap_socket(conn, server_side=True).close()
            except (OSError, ValueError, struct.error):
                pass
            finally:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()

    def close():
        stop.set()
        listener.close()

    return f"127.0.0.1:{listener.getsockname()[1]}", close


def test_tls_1_3_asked_of_an_nsqd_that_stops_at_1_2_names_its_version_and_the_fix(pki, topic):
    address, close = _tls12_nsqd(pki["cert"], pki["key"])
    try:
        r = run_nsqcli(["pub", topic, "x", "--nsqd-tcp-address", address, "--tls-ca-file", pki["ca"],
                        "--tls-min-version", "1.3"])
        line = one_error_line(r, 1, r"nsqd v1\.2\.1 accepts none of --tls-min-version 1\.3")
        assert "nsqd 1.2.1 and older support TLS up to 1.2" in line and "lower --tls-min-version" in line
        r = run_nsqcli(["doctor", "--json", "--nsqd-tcp-address", address, "--nsqd-http-address", "127.0.0.1:1",
                        "--tls-ca-file", pki["ca"], "--tls-min-version", "1.3"])
        tcp = json.loads(r.stdout)["checks"][0]
        assert tcp["status"] == "fail" and "nsqd v1.2.1 accepts none of" in tcp["detail"], tcp
        assert "lower --tls-min-version" in tcp["fix"] and "nsqlookupd" not in tcp["fix"], tcp
    finally:
        close()


# -- HTTPS: an nsqd whose HTTP API is HTTPS only ---------------------------------------------------
def test_stat_and_admin_work_on_an_https_only_nsqd_with_the_same_tls_options(strict_nsqd, pki, topic):
    https = f"https://{strict_nsqd.https_address}"
    http_post_tls = run_nsqcli(["pub", topic, "x", "--nsqd-tcp-address", strict_nsqd.tcp_address, *_client_tls(pki)])
    assert http_post_tls.returncode == 0, http_post_tls.stderr
    for address in (https, strict_nsqd.http_address):  # plain HTTP: its 403 TLS_REQUIRED leads to HTTPS
        r = run_nsqcli(["stat", topic, "-n", "1", "--interval", "0.2s", "--json", "--nsqd-http-address", address,
                        *_client_tls(pki)])
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)["rows"]
        assert [(row["topic"], row["depth"]) for row in rows] == [(topic, 1)], rows
    r = run_nsqcli(["topic", "pause", topic, "--nsqd-http-address", https, *_client_tls(pki)])
    assert r.returncode == 0 and r.stdout.decode().startswith(f"ok   nsqd {https}: POST /topic/pause"), r.stderr
    r = run_nsqcli(["stat", topic, "-n", "1", "--interval", "0.2s", "--json", "--nsqd-http-address", https,
                    *_client_tls(pki)])
    assert json.loads(r.stdout)["rows"][0]["paused"] is True and _https_stats(strict_nsqd, topic)["paused"], r.stdout
    r = run_nsqcli(["stat", topic, "-n", "1", "--interval", "0.2s", "--nsqd-http-address", https,
                    "--tls-ca-file", pki["ca"]])
    assert r.returncode == 1 and b"requires a client certificate" in r.stderr and b"--tls-cert" in r.stderr, r.stderr


def test_an_http_address_given_for_an_https_port_says_to_use_https(nsqd_factory, pki):
    server = nsqd_factory(tls_cert=pki["cert"], tls_key=pki["key"])
    r = run_nsqcli(["topic", "create", "x", "--nsqd-http-address", server.https_address])
    line = one_error_line(r, 1, r"HTTP 400")
    assert f"use https://{server.https_address}" in line, line


def test_doctor_reads_tls_required_as_https_only_and_checks_there(strict_nsqd, pki):
    base = ["doctor", "--json", "--nsqd-tcp-address", strict_nsqd.tcp_address,
            "--nsqd-http-address", strict_nsqd.http_address]
    r = run_nsqcli(base)
    checks = {c["target"]: c for c in json.loads(r.stdout)["checks"]}
    http = checks[f"nsqd {strict_nsqd.http_address} (HTTP)"]
    assert http["status"] == "fail", http
    assert (f"this nsqd requires TLS for its HTTP API (403 TLS_REQUIRED): use https://{strict_nsqd.https_address}"
            in http["detail"]), http
    assert "another server" not in http["fix"] and "--tls-ca-file" in http["fix"], http
    tcp = checks[f"nsqd {strict_nsqd.tcp_address} (TCP)"]
    assert tcp["status"] == "fail" and "TLS required" in tcp["detail"] and "add --tls " in tcp["fix"], tcp
    r = run_nsqcli(base + _client_tls(pki))
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["ok"], doc
    assert any(f"HTTPS only: https://{strict_nsqd.https_address}" in c["detail"] for c in doc["checks"]), doc


@pytest.mark.parametrize("flag, env", [("--snappy", {}), ("--deflate", {}), (None, {"NSQCLI_SNAPPY": "1"})])
def test_doctor_negotiates_compression(nsqd, flag, env):
    r = run_nsqcli(["doctor", "--json", "--nsqd-tcp-address", nsqd.tcp_address] + ([flag] if flag else []),
                   {**env, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address})
    assert r.returncode == 0, r.stderr
    kind = "deflate" if flag == "--deflate" else "snappy"
    assert f"compression {kind}" in json.loads(r.stdout)["checks"][0]["detail"], r.stdout


# -- AUTH without TLS --------------------------------------------------------------------------------
def test_an_auth_secret_without_tls_is_warned_about_only_when_it_leaves_the_host():
    from nsqcli.cli.options import plain_auth_warning

    remote = {"auth_secret": "s", "nsqd_tcp_addresses": ("10.0.0.7:4150", "127.0.0.1:4150")}
    assert plain_auth_warning(remote) == (
        "the AUTH secret goes to nsqd 10.0.0.7:4150 over plain TCP, without TLS: anyone on the path can read "
        "it; add --tls (nsqd needs --tls-cert/--tls-key)")
    assert "the nsqd nsqlookupd http://lookupd.example:4161 names over plain TCP" in plain_auth_warning(
        {"auth_secret_file": "f", "lookupd_http_addresses": ("http://lookupd.example:4161",)})
    assert "--destination-tls" in plain_auth_warning({**remote, "option_prefix": "destination-"})
    assert plain_auth_warning({**remote, "tls": True}) is None
    assert plain_auth_warning({**remote, "tls_ca_file": "ca.pem"}) is None
    assert plain_auth_warning({"auth_secret": "s", "nsqd_tcp_addresses": ("127.0.0.1:4150", "localhost:4150",
                                                                          "[::1]:4150")}) is None
    assert plain_auth_warning({"nsqd_tcp_addresses": ("10.0.0.7:4150",)}) is None


def test_an_auth_secret_to_a_loopback_nsqd_without_tls_says_nothing_about_tls(nsqd, topic):
    r = run_nsqcli(["pub", topic, "x", "--nsqd-tcp-address", nsqd.tcp_address],
                   {"NSQCLI_AUTH_SECRET": "s3cret"})
    assert r.returncode == 0 and b"plain TCP" not in r.stderr, r.stderr
