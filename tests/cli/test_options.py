"""The shared connection options (cli/options.py): TLS, compression and AUTH flags on real nsqd."""

from __future__ import annotations

from helpers import run_nsqcli as run


def test_cli_tls_snappy_deflate_and_auth(nsqd_factory, tmp_path, topic):
    from nsq_fixtures import AuthServer, make_cert

    cert, key = make_cert(tmp_path)
    with AuthServer({"s3cret": [(".*", [".*"], ["subscribe", "publish"])]}) as auth:
        server = nsqd_factory(tls_cert=cert, tls_key=key, auth_http_address=auth.address)
        base = ["--nsqd-tcp-address", server.tcp_address, "--tls", "--tls-ca-file", cert]
        secret_file = tmp_path / "secret"
        secret_file.write_text("s3cret\n")
        r = run(["pub", "-t", topic, "--snappy", "--auth-secret", "s3cret", *base, "over tls+snappy"])
        assert r.returncode == 0, r.stderr
        r = run(["mpub", "-t", topic, "--deflate", "--auth-secret-file", str(secret_file), *base], input=b"x\ny")
        assert r.returncode == 0, r.stderr
        r = run(["tail", "-t", topic, "-n", "3", "-c", "c", "--deflate", *base],
                {"NSQCLI_AUTH_SECRET": "s3cret"})
        assert r.returncode == 0 and r.stdout == b"over tls+snappy\nx\ny\n", r.stderr
        r = run(["pub", "-t", topic, "--auth-secret", "wrong-one", *base, "x"])
        assert r.returncode == 1 and b"E_AUTH_FAILED" in r.stderr and b"wrong-one" not in r.stderr
        r = run(["pub", "-t", topic, "--nsqd-tcp-address", server.tcp_address, "--tls", "x"])
        assert r.returncode == 1 and b"TLS certificate verification failed" in r.stderr
        r = run(["pub", "-t", topic, "--snappy", "--deflate", *base, "x"])
        assert r.returncode == 2 and b"cannot be used together" in r.stderr
