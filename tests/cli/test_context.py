"""`nsqcli context`: saved connection settings."""

from __future__ import annotations

import json

from tests.support.helpers import one_error_line, run_nsqcli, topic_stats
from tests.support.inprocess import run_in_process


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
    one_error_line(run_in_process(["context", "add", "dead", "--nsqd-tcp-address", "127.0.0.1:1"], cfg), 2,
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
    one_error_line(run_in_process(["--context", "nope", "pub", topic, "x"], cfg), 2,
                   r"no context named 'nope' \(known: dead, live")
    assert run_nsqcli(["context", "rm", "dead"], cfg).returncode == 0
    assert json.loads(run_nsqcli(["context", "ls", "--json"], cfg).stdout) == [
        {"name": "live", "selected": False, "description": "the test nsqd"}]
    one_error_line(run_in_process(["context", "add", "x", "--auth-secret", "inline"], cfg), 2,
                   r"No such option '--auth-secret'\. \(Did you mean one of: '--auth-secret-file'")


# -- refusals: bad input, footguns, a context that cannot be used (one line, exit 2, nothing sent) -------
import re  # noqa: E402

import pytest  # noqa: E402
from tests.support.refusals import FILE, argv_footgun, bad_input, fill, ids, refused, untouched  # noqa: E402

BAD_INPUT = [
    (["context", "add", "bad name!", "--nsqd-tcp-address", "h:1"], 2, r"context name 'bad name!' must be"),
    (["context", "add", "x"], 2, r"give at least one --nsqd-tcp-address, --nsqd-http-address or"),
    (["context", "add", "x", "--nsqd-tcp-address", "nope"], 2, r"invalid address 'nope': expected HOST:PORT"),
    (["context", "show", "nope"], 2, r"no context named 'nope'"),
    (["context", "show"], 2, r"no context selected; name one"),
    (["context", "select"], 2, r"give a context NAME or --none"),
    (["context", "select", "nope"], 2, r"no context named 'nope'"),
    (["context", "rm", "nope"], 2, r"no context named 'nope'"),
    (["context", "frob"], 2, r"No such command 'frob'"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


ARGV_FOOTGUNS = [
    (["context", "add", "x", "-nsqd-tcp-address", "{tcp}"], r"use --nsqd-tcp-address"),
]


@pytest.mark.parametrize("args,pattern", ARGV_FOOTGUNS, ids=ids(ARGV_FOOTGUNS, width=50))
def test_argv_footgun_is_refused_before_acting(nsqd, topic, args, pattern):
    argv_footgun(nsqd, topic, args, pattern)


def _files(cfg, files: dict) -> None:
    for rel, text in files.items():
        (cfg / rel).parent.mkdir(parents=True, exist_ok=True)
        (cfg / rel).write_text(text)


CONTEXTS = [  # (files in the config dir, env, args, pattern)
    ({"contexts/bad.toml": "nsqd-tcp-address = 42150\n"}, {}, ["pub", "{t}", "x", "--context", "bad"],
     r"'--context': .*/contexts/bad\.toml: context 'bad': nsqd-tcp-address = 42150 is not valid: "
     r"use \[\"127\.0\.0\.1:4150\"\] \(a list of strings\)"),
    ({"contexts/bad.toml": 'tls = "yes"\n'}, {"NSQCLI_CONTEXT": "bad"}, ["tail", "{t}", "-n", "1"],
     r"bad\.toml: context 'bad': tls = \"yes\" is not valid: use true or false"),
    ({"contexts/bad.toml": "deflate-level = \"9\"\n", "config.toml": 'context = "bad"\n'}, {},
     ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"], r"context 'bad': deflate-level = \"9\" is not valid: use a whole"),
    ({"contexts/bad.toml": "nsqd-tcp-address = [1]\n"}, {}, ["context", "show", "bad"],
     r"context 'bad': nsqd-tcp-address = \[1\] is not valid"),
    ({"config.toml": 'context = "gone"\n', "contexts/other.toml": "tls = true\n"}, {},
     ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"],
     r"the selected context 'gone' \(.*config\.toml\) no longer exists; select another \('nsqcli context select NAME'\)"),
    ({}, {"NSQCLI_CONTEXT": "gone"}, ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"], r"no context named 'gone'"),
    ({}, {"NSQCLI_CONFIG_DIR": "{file}"}, ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"],
     r"NSQCLI_CONFIG_DIR=.*refusals\.py is not a directory"),
    ({}, {"NSQCLI_CONFIG_DIR": "{file}"}, ["context", "ls"], r"NSQCLI_CONFIG_DIR=.* is not a directory"),
    ({}, {"NSQCLI_CONFIG_DIR": "{file}"}, ["context", "add", "x", "--nsqd-tcp-address", "{tcp}"],
     r"NSQCLI_CONFIG_DIR=.* is not a directory"),
]


@pytest.mark.parametrize("files,env,args,pattern", CONTEXTS, ids=[" ".join(c[2])[:50] for c in CONTEXTS])
def test_a_context_that_cannot_be_used_is_one_usage_line(nsqd, topic, tmp_path, files, env, args, pattern):
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    _files(cfg, files)
    env = {"NSQCLI_CONFIG_DIR": str(cfg), **{k: v.format(file=FILE) for k, v in env.items()}}
    refused(run_in_process(fill(args, nsqd, topic, FILE), env, input=b""), 2, pattern)
    untouched(nsqd, topic)


def test_a_sandbox_context_is_stale_once_the_sandbox_is_gone(nsqd, topic, tmp_path):
    import json
    import os
    import signal

    from tests.support.helpers import wait_for

    env = {"NSQCLI_CONFIG_DIR": str(tmp_path / "cfg")}
    if os.environ.get("NSQCLI_NSQ_BIN"):  # where the session's nsqd came from
        env["NSQCLI_NSQ_BIN"] = os.environ["NSQCLI_NSQ_BIN"]
    r = run_nsqcli(["sandbox", "--detach", "--no-lookupd", "--save-context", "dev"], env, timeout=60)
    assert r.returncode == 0, r.stderr
    pid = int(re.search(rb"NSQCLI_SANDBOX_PID=(\d+)", r.stdout).group(1))
    try:
        assert b"stale" not in run_nsqcli(["context", "ls"], env).stdout
        assert run_nsqcli(["pub", topic, "x", "--context", "dev"], env).returncode == 0
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: b"stale" in run_nsqcli(["context", "ls"], env).stdout, what="the context is stale")
    assert run_nsqcli(["context", "ls"], env).stdout.decode() == (
        f"  dev  {json.loads(run_nsqcli(['context', 'ls', '--json'], env).stdout)[0]['description']}  "
        f"(stale: the sandbox that saved it is gone (pid {pid}))\n")
    refused(run_nsqcli(["pub", topic, "y", "--context", "dev", "--nsqd-tcp-address", nsqd.tcp_address], env), 2,
             rf"the sandbox that saved context 'dev' is gone \(pid {pid}\); start it again or 'nsqcli context rm dev'")
    assert topic_stats(nsqd, topic) is None  # the first pub went to the sandbox's nsqd, the second nowhere
    assert run_nsqcli(["context", "rm", "dev"], env).returncode == 0
