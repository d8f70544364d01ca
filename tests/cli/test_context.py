"""`nsqcli context`: saved connection settings."""

from __future__ import annotations

import json

from helpers import one_error_line, run_nsqcli, topic_stats


# -- contexts --------------------------------------------------------------------------------------
def test_contexts_add_select_override_and_remove(nsqd, topic, tmp_path):
    cfg = {"NSQCLI_CONFIG_DIR": str(tmp_path / "cfg")}
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-value\n")
    r = run_nsqcli(["context", "add", "live", "--nsqd-tcp-address", nsqd.tcp_address, "--nsqd-http-address",
                    nsqd.http_address, "--auth-secret-file", str(secret), "--description", "the test nsqd"], cfg)
    assert r.returncode == 0, r.stderr
    run_nsqcli(["context", "add", "dead", "--nsqd-tcp-address", "127.0.0.1:1"], cfg)
    # one_error_line: adding it again without --force
    one_error_line(run_nsqcli(["context", "add", "dead", "--nsqd-tcp-address", "127.0.0.1:1"], cfg), 2,
                   r"context 'dead' exists \(use --force")
    # the secret is stored by reference and never shown
    toml = (tmp_path / "cfg" / "contexts" / "live.toml").read_text()
    assert "s3cr3t" not in toml and str(secret) in toml
    shown = run_nsqcli(["context", "show", "live"], cfg).stdout.decode()
    assert "s3cr3t" not in shown and f"auth-secret-file: {secret}" in shown
    # --context NAME: pub goes to the context's nsqd (the secret's AUTH warning proves it was read)
    r = run_nsqcli(["--context", "live", "pub", topic, "one"], cfg)
    assert r.returncode == 0 and b"does not use AUTH" in r.stderr
    # after the subcommand, and through NSQCLI_CONTEXT
    assert run_nsqcli(["pub", topic, "two", "--context", "live", "-q"], cfg).returncode == 0
    assert run_nsqcli(["pub", topic, "three", "-q"], {**cfg, "NSQCLI_CONTEXT": "live"}).returncode == 0
    # selected context; a flag and an env var override it
    run_nsqcli(["context", "select", "dead"], cfg)
    assert run_nsqcli(["context", "ls"], cfg).stdout.decode().splitlines() == ["* dead", "  live  the test nsqd"]
    one_error_line(run_nsqcli(["pub", topic, "x"], cfg), 1, r"127\.0\.0\.1:1: cannot connect")
    assert run_nsqcli(["pub", topic, "four", "--nsqd-tcp-address", nsqd.tcp_address], cfg).returncode == 0
    assert run_nsqcli(["pub", topic, "five"], {**cfg, "NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address}).returncode == 0
    assert run_nsqcli(["--context", "none", "pub", topic, "six", "--nsqd-tcp-address", nsqd.tcp_address],
                      cfg).returncode == 0
    assert topic_stats(nsqd, topic)["message_count"] == 6
    # stat takes the context's nsqd HTTP address
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--no-live", "--context", "live"], cfg)
    assert r.returncode == 0 and r.stdout.decode().splitlines()[2].split("|")[1].split()[0] == "6"
    one_error_line(run_nsqcli(["--context", "nope", "pub", topic, "x"], cfg), 2,
                   r"no context named 'nope' \(known: dead, live")
    assert run_nsqcli(["context", "rm", "dead"], cfg).returncode == 0
    assert json.loads(run_nsqcli(["context", "ls", "--json"], cfg).stdout) == [
        {"name": "live", "selected": False, "description": "the test nsqd"}]
    one_error_line(run_nsqcli(["context", "add", "x", "--auth-secret", "inline"], cfg), 2,
                   r"No such option '--auth-secret'\. \(Did you mean one of: '--auth-secret-file'")
