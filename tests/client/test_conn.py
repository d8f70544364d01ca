"""The connection lifecycle on real nsqd: TLS, snappy, deflate, AUTH, failing fast."""

from __future__ import annotations

import time

import pytest
from tests.support.helpers import consume, http_get_json
from tests.support.nsq_fixtures import AuthServer, make_cert

from nsqcli import Config, Consumer, Producer
from nsqcli.client.config import TLSConfig
from nsqcli.errors import AuthError, ConnectError, NSQError, PublishError, TransportError

BODIES = [b"plain", b"with\nnewline", bytes(range(256)), b"\x00" * 10, "é✓".encode(), b"x" * 100_000]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    return make_cert(d, "server"), make_cert(d, "other")


@pytest.mark.parametrize("feature", ["snappy", "deflate"])
def test_compression(nsqd, topic, feature):
    cfg = {feature: True}
    with Producer(nsqd.tcp_address, Config(**cfg)) as p:
        p.multi_publish(topic, BODIES * 20)
        stats = http_get_json(nsqd.http_address, "/stats", format="json")
        assert any(pr[feature] for pr in stats["producers"])
    col = consume(topic, len(BODIES) * 20, [nsqd.tcp_address], max_in_flight=100, **cfg)
    assert sorted(col.bodies) == sorted(BODIES * 20)


def test_tls_verified(nsqd_factory, certs, topic):
    (cert, key), (other_cert, _) = certs
    server = nsqd_factory(tls_cert=cert, tls_key=key)
    tls = TLSConfig(enabled=True, ca_file=cert)
    with Producer(server.tcp_address, Config(tls=tls, snappy=True)) as p:
        p.multi_publish(topic, BODIES)
        clients = http_get_json(server.http_address, "/stats", format="json")["producers"]
        assert clients[0]["tls"] and clients[0]["snappy"] and clients[0]["tls_version"].startswith("TLS")
    col = consume(topic, len(BODIES), [server.tcp_address], tls=tls, deflate=True)
    assert sorted(col.bodies) == sorted(BODIES)
    # a wrong CA is refused with a clear error
    with pytest.raises(PublishError, match="TLS certificate verification failed"):
        Producer(server.tcp_address, Config(tls=TLSConfig(enabled=True, ca_file=other_cert))).publish(topic, b"x")
    # ... unless verification is explicitly skipped
    with Producer(server.tcp_address, Config(tls=TLSConfig(enabled=True, insecure_skip_verify=True))) as p:
        p.publish(topic, b"insecure")
    # TLS asked from a server without it
    with pytest.raises(PublishError, match="does not offer it"):
        Producer(nsqd_factory().tcp_address, Config(tls=tls)).publish(topic, b"x")


def test_auth(nsqd_factory, topic):
    grants = {"all": [(".*", [".*"], ["subscribe", "publish"])],
              "pub": [(topic, [".*"], ["publish"])]}
    with AuthServer(grants) as auth:
        server = nsqd_factory(auth_http_address=auth.address)
        with Producer(server.tcp_address, Config(auth_secret="all")) as p:
            p.publish(topic, b"authed")
            assert p._links[server.tcp_address].auth_info["identity"] == "user-all"
        col = consume(topic, 1, [server.tcp_address], auth_secret="all")
        assert col.bodies == [b"authed"]
        with pytest.raises(PublishError) as e:  # wrong secret
            Producer(server.tcp_address, Config(auth_secret="nope")).publish(topic, b"x")
        assert isinstance(e.value.cause, AuthError) and "E_AUTH_FAILED" in str(e.value)
        with pytest.raises(PublishError, match="requires authentication"):  # no secret
            Producer(server.tcp_address).publish(topic, b"x")
        # allowed to publish, denied to subscribe
        Producer(server.tcp_address, Config(auth_secret="pub")).publish(topic, b"ok")
        c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[server.tcp_address],
                     config=Config(auth_secret="pub"))
        with pytest.raises(AuthError, match="E_UNAUTHORIZED"):
            c.start()
        assert {call["secret"] for call in auth.calls} >= {"all", "nope", "pub"}


def test_start_fails_fast_with_clear_error(topic):
    c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=["127.0.0.1:1"])
    c._report = lambda e: None
    with pytest.raises(ConnectError, match="127.0.0.1:1: cannot connect"):
        c.start()
    with pytest.raises(TransportError):
        Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=["127.0.0.1:1"]).start()


def test_tls_client_certificate_required(nsqd_factory, certs, tmp_path, topic):
    """nsqd --tls-client-auth-policy=require-verify: only a client with a certificate it trusts."""
    (cert, key), _ = certs
    client_cert, client_key = make_cert(tmp_path, "client")
    server = nsqd_factory(tls_cert=cert, tls_key=key, tls_root_ca_file=client_cert,
                          tls_client_auth_policy="require-verify", tls_required=True)
    ok = TLSConfig(enabled=True, ca_file=cert, cert_file=client_cert, key_file=client_key, min_version="1.2")
    with Producer(server.tcp_address, Config(tls=ok)) as p:
        p.publish(topic, b"mutual")
        (client,) = http_get_json(server.http_address, "/stats", format="json")["producers"]
        assert client["tls"] and client["tls_version"] in ("TLS1.2", "TLS1.3")
    with pytest.raises(PublishError):
        Producer(server.tcp_address, Config(tls=TLSConfig(enabled=True, ca_file=cert))).publish(topic, b"x")


@pytest.mark.parametrize("server_max, mif, want", [(None, 1000, 65536), (None, 10, 16384),
                                                   (32768, 1000, 16384)])
def test_output_buffer_chosen_for_the_consumer(nsqd_factory, topic, server_max, mif, want):
    """A consumer with enough in flight asks nsqd for 64 KiB output buffers (fewer, bigger
    writes); an nsqd whose --max-output-buffer-size is lower refuses that, and the connection
    is made again with nsqd's default - the user sees messages, not E_BAD_BODY."""
    server = nsqd_factory(extra_args=[f"--max-output-buffer-size={server_max}"] if server_max else [])
    with Producer(server.tcp_address) as p:
        p.multi_publish(topic, BODIES)
    got = []
    c = Consumer(topic, "c", got.append, nsqd_tcp_addresses=[server.tcp_address],
                 config=Config(max_in_flight=mif))
    c.start()
    try:
        deadline = time.monotonic() + 10
        while len(got) < len(BODIES) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(m.body for m in got) == sorted(BODIES)
        (handle,) = c._links.values()
        assert handle.conn.features["output_buffer_size"] == want
    finally:
        c.stop()


def test_output_buffer_the_user_chose_is_not_second_guessed(nsqd_factory, topic):
    server = nsqd_factory(extra_args=["--max-output-buffer-size=32768"])
    c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[server.tcp_address],
                 config=Config(max_in_flight=1000, output_buffer_size=65536))
    with pytest.raises(NSQError, match="output buffer size"):
        c.start()
    c.stop()
