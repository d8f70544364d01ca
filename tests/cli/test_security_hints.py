"""Security hints: options that weaken security say so once per run on stderr (not once per
connection), and the safe ways (a 0600 secret file, the NSQCLI_ variable) say nothing."""

from __future__ import annotations

import os

from tests.support.helpers import http_post, run_nsqcli
from tests.support.nsq_fixtures import make_cert


def _lines(err: bytes, needle: str) -> list[str]:
    return [ln for ln in err.decode().splitlines() if needle in ln]


def test_tls_insecure_skip_verify_warns_once_however_many_connections(nsqd_factory, tmp_path):
    cert, key = make_cert(tmp_path)
    server = nsqd_factory(tls_cert=cert, tls_key=key)
    for t in ("hint_a", "hint_b"):  # two topics: two consumers, two TLS connections
        http_post(server.http_address, "/pub", t.encode(), topic=t)
    r = run_nsqcli(["tail", "hint_a", "hint_b", "-n", "2", "--drain-backlog", "--tls-insecure-skip-verify",
                    "--nsqd-tcp-address", server.tcp_address], timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == [b"hint_a", b"hint_b"]
    hints = _lines(r.stderr, "tls-insecure-skip-verify")
    assert hints == ["nsqcli: warning: --tls-insecure-skip-verify: nsqd's certificate and hostname are not "
                     "checked; anyone on the path can read and change the traffic"], r.stderr


def _pub_with_secret_file(nsqd, tmp_path, mode: int):
    path = tmp_path / "secret"
    path.write_text("s3cret\n")
    os.chmod(path, mode)
    return path, run_nsqcli(["pub", "hint_file", "x", "--auth-secret-file", str(path),
                             "--nsqd-tcp-address", nsqd.tcp_address])


def test_an_auth_secret_file_others_can_read_is_named_with_its_mode(nsqd, tmp_path):
    path, r = _pub_with_secret_file(nsqd, tmp_path, 0o644)
    assert r.returncode == 0, r.stderr
    assert _lines(r.stderr, "auth-secret-file") == [
        f"nsqcli: warning: --auth-secret-file {path} has mode 0644: other users may read the secret; "
        f"chmod 600 {path}"], r.stderr


def test_a_0600_auth_secret_file_says_nothing_about_its_mode(nsqd, tmp_path):
    _, r = _pub_with_secret_file(nsqd, tmp_path, 0o600)
    assert r.returncode == 0 and not _lines(r.stderr, "chmod"), r.stderr


def test_an_auth_secret_on_the_command_line_is_said_to_be_visible_in_ps(nsqd):
    r = run_nsqcli(["pub", "hint_cli", "x", "--auth-secret", "s3cret", "--nsqd-tcp-address", nsqd.tcp_address])
    assert r.returncode == 0, r.stderr
    assert _lines(r.stderr, "'ps'") == [
        "nsqcli: warning: --auth-secret on the command line is visible to every user in 'ps': use "
        "--auth-secret-file or NSQCLI_AUTH_SECRET"], r.stderr
    assert b"s3cret" not in r.stderr


def test_an_auth_secret_from_the_environment_says_nothing(nsqd):
    r = run_nsqcli(["pub", "hint_env", "x", "--nsqd-tcp-address", nsqd.tcp_address],
                   env_addr={"NSQCLI_AUTH_SECRET": "s3cret"})
    assert r.returncode == 0 and not _lines(r.stderr, "'ps'"), r.stderr


def test_the_auth_secret_help_says_where_it_is_visible():
    r = run_nsqcli(["pub", "--help"])
    text = " ".join(r.stdout.decode().split())
    assert "visible to every user in 'ps': prefer --auth-secret-file or NSQCLI_AUTH_SECRET" in text
