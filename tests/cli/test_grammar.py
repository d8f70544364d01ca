"""One grammar for every command, as a user sees it: TOPIC/CHANNEL as arguments or -t/-c,
--json as one line, --timeout exit 3, `help COMMAND`, did-you-mean, one line per failure, and a
declined confirmation exits 1. Real nsqd and nsqlookupd; the real nsqcli executable."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from helpers import NSQCLI, channel_stats, clean_env, http_post, run_nsqcli, topic_stats, wait_for

DEAD = "127.0.0.1:1"  # nothing listens there


def one_error_line(r, code: int, pattern: str) -> str:
    err = r.stderr.decode()
    assert r.returncode == code, (r.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsqcli: error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def one_json_line(r) -> dict:
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.endswith("\n") and out.count("\n") == 1, out
    return json.loads(out)


# -- the same command, both spellings ------------------------------------------------------------

def _forms(nsqd, lookupd, topic):
    """(positional argv, -t/-c argv, what to compare): stdout bytes or a JSON field."""
    n_http, l_http = ["--nsqd-http-address", nsqd.http_address], ["--lookupd-http-address", lookupd.http_address]
    return {
        "lookup": (["lookup", topic, "--json", *l_http], ["lookup", "-t", topic, "--json", *l_http]),
        "topic create": (["topic", "create", topic, "--dry-run", *n_http],
                         ["topic", "create", "-t", topic, "--dry-run", *n_http]),
        "channel pause": (["channel", "pause", topic, "ch", "--dry-run", "--json", *n_http],
                          ["channel", "pause", "-t", topic, "-c", "ch", "--dry-run", "--json", *n_http]),
        "node tombstone": (["node", "tombstone", topic, nsqd.tcp_address, "--dry-run", *l_http],
                           ["node", "tombstone", "-t", topic, nsqd.tcp_address, "--dry-run", *l_http]),
        "stat": (["stat", topic, "ch", "-n", "1", "--interval", "0.1s", "--json", *n_http],
                 ["stat", "-t", topic, "-c", "ch", "-n", "1", "--interval", "0.1s", "--json", *n_http]),
    }


@pytest.mark.parametrize("name", ["lookup", "topic create", "channel pause", "node tombstone", "stat"])
def test_positional_and_option_forms_do_the_same(name, nsqd, lookupd, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="ch")
    wait_for(lambda: run_nsqcli(["lookup", topic, "--lookupd-http-address", lookupd.http_address]).returncode == 0)
    positional, flagged = _forms(nsqd, lookupd, topic)[name]
    a, b = run_nsqcli(positional), run_nsqcli(flagged)
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    if name == "stat":  # numbers (rates) may differ between two polls; the rows must not
        rows = [[(r["topic"], r["channel"]) for r in json.loads(x.stdout)["rows"]] for x in (a, b)]
        assert rows[0] == rows[1] and (topic, "ch") in rows[0]
    else:
        assert a.stdout == b.stdout and topic.encode() in a.stdout


@pytest.mark.parametrize("form", ["positional", "option"])
def test_publish_and_consume_take_both_forms(form, nsqd, topic):
    addr = ["--nsqd-tcp-address", nsqd.tcp_address]
    t = [topic] if form == "positional" else ["-t", topic]
    assert one_json_line(run_nsqcli(["pub", *t, "one", "--json", *addr]))["topic"] == topic
    assert one_json_line(run_nsqcli(["mpub", *t, "--json", *addr], input=b"two\nthree\n"))["published"] == 2
    assert topic_stats(nsqd, topic)["message_count"] == 3
    r = run_nsqcli(["tail", *t, "-c", "c1", "-n", "3", "--timeout", "20s", *addr])
    assert r.returncode == 0 and sorted(r.stdout.split()) == [b"one", b"three", b"two"], r.stderr
    r = run_nsqcli(["bench", "pub", *t, "-n", "5", "--json", *addr])
    assert one_json_line(r)["pub"]["messages"] == 5 and topic_stats(nsqd, topic)["message_count"] == 8
    r = run_nsqcli(["bench", "sub", *t, "c1", "-n", "5", "--json", "--timeout", "20s", *addr]) \
        if form == "positional" else \
        run_nsqcli(["bench", "sub", *t, "-c", "c1", "-n", "5", "--json", "--timeout", "20s", *addr])
    assert one_json_line(r)["sub"]["messages"] == 5 and channel_stats(nsqd, topic, "c1")["depth"] == 0


CONFLICTS = [
    (["stat", "a", "-t", "b"], r"TOPIC given twice: 'a' as an argument and 'b' with -t \(give it once\)"),
    (["stat", "a", "x", "-t", "a", "-c", "y"], r"CHANNEL given twice: 'x' as an argument and 'y' with -c"),
    (["lookup", "a", "-t", "b"], r"TOPIC given twice"),
    (["doctor", "a", "-t", "b"], r"TOPIC given twice"),
    (["to-http", "a", "-t", "b", "--post", "http://127.0.0.1:1/"], r"TOPIC given twice"),
    (["to-http", "a", "c", "-c", "d", "--post", "http://127.0.0.1:1/"], r"CHANNEL given twice"),
    (["topic", "create", "a", "-t", "b"], r"TOPIC given twice"),
    (["channel", "create", "a", "c", "-t", "b"], r"TOPIC given twice"),
    (["channel", "delete", "a", "c", "-c", "d"], r"CHANNEL given twice"),
    (["bench", "sub", "a", "-t", "b"], r"TOPIC given twice"),
    (["bench", "pub", "a", "c", "-c", "d"], r"CHANNEL given twice"),
    (["stat", "a", "b", "c"], r"too many arguments: 'c'"),
]


@pytest.mark.parametrize("args,pattern", CONFLICTS, ids=[" ".join(c[0][:2]) + str(i) for i, c in enumerate(CONFLICTS)])
def test_both_forms_with_different_values_is_one_usage_line(args, pattern):
    one_error_line(run_nsqcli(args), 2, pattern)


MISSING = [
    (["pub"], r"missing TOPIC \(nsqcli pub TOPIC \[MESSAGE\], or -t TOPIC\)"),
    (["mpub"], r"missing TOPIC \(nsqcli mpub TOPIC \[FILE\]\.\.\., or -t TOPIC\)"),
    (["tail"], r"missing TOPIC \(nsqcli tail TOPIC\.\.\., or -t TOPIC\)"),
    (["to-nsq", "--destination-nsqd-tcp-address", DEAD], r"missing TOPIC \(nsqcli to-nsq TOPIC\.\.\."),
    (["to-http", "--post", "http://127.0.0.1:1/"], r"missing TOPIC \(nsqcli to-http TOPIC \[CHANNEL\]"),
    (["topic", "create"], r"missing TOPIC \(nsqcli topic create TOPIC, or -t TOPIC\)"),
    (["channel", "create", "t"], r"missing CHANNEL \(nsqcli channel create TOPIC \[CHANNEL\], or -c CHANNEL\)"),
    (["node", "tombstone", "t"], r"missing NODE"),
    (["node", "tombstone", "-t", "t", "n1", "n2"], r"too many arguments: 'n1 n2'"),
    (["replay", "t"], r"missing ARCHIVE"),
    (["to-parquet", "-o", "/tmp/x", "--checkpoint", "/tmp/y"], r"missing TOPIC \(nsqcli to-parquet TOPIC\.\.\."),
]


@pytest.mark.parametrize("args,pattern", MISSING, ids=[" ".join(m[0][:2]) for m in MISSING])
def test_neither_form_is_one_usage_line(args, pattern):
    one_error_line(run_nsqcli(args), 2, pattern)


# -- --json: one line everywhere -----------------------------------------------------------------

def test_json_results_are_one_line(nsqd, lookupd, topic):
    n_http, l_http = ["--nsqd-http-address", nsqd.http_address], ["--lookupd-http-address", lookupd.http_address]
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    wait_for(lambda: run_nsqcli(["lookup", topic, *l_http]).returncode == 0)
    assert topic in [t["topic"] for t in one_json_line(run_nsqcli(["lookup", "--json", *l_http]))["topics"]]
    assert one_json_line(run_nsqcli(["lookup", topic, "--json", *l_http]))["topics"][0]["producers"]
    assert "checks" in one_json_line(run_nsqcli(["doctor", topic, "--json", "--nsqd-tcp-address", nsqd.tcp_address,
                                                 *n_http]))
    assert one_json_line(run_nsqcli(["topic", "pause", topic, "--json", *n_http]))["action"] == "pause"
    assert one_json_line(run_nsqcli(["stat", topic, "-n", "1", "--interval", "0.1s", "--json", *n_http]))["rows"]
    assert "nsqcli" in one_json_line(run_nsqcli(["version", "--json"]))


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as to-http expects
    bodies: list = []

    def do_POST(self):  # noqa: N802
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def http_sink():
    """A keep-alive HTTP endpoint answering 200 to every POST; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


def test_relay_summaries_are_one_json_line(nsqd, topic):
    addr = ["--nsqd-tcp-address", nsqd.tcp_address]
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    for channel in ("web", "copy"):
        http_post(nsqd.http_address, "/channel/create", topic=topic, channel=channel)
    for body in (b"a", b"b"):
        http_post(nsqd.http_address, "/pub", body, topic=topic)
    with http_sink() as url:
        r = run_nsqcli(["to-http", topic, "web", "--post", url, "-n", "2", "--json", "--no-live", *addr], timeout=60)
    doc = one_json_line(r)
    assert (doc["topic"], doc["channel"], doc["delivered"]) == (topic, "web", 2)
    assert channel_stats(nsqd, topic, "web")["depth"] == 0
    r = run_nsqcli(["to-nsq", topic, "-c", "copy", "--destination-topic", topic + "_copy", "-n", "2", "--json",
                    "--no-live", "--destination-nsqd-tcp-address", nsqd.tcp_address, *addr], timeout=60)
    doc = one_json_line(r)
    assert (doc["topics"], doc["copied"]) == ([topic], 2) and topic_stats(nsqd, topic + "_copy")["message_count"] == 2


def test_to_file_summary_is_one_json_line(nsqd, topic, tmp_path):
    for body in (b"a", b"b", b"c"):
        http_post(nsqd.http_address, "/pub", body, topic=topic)
    p = subprocess.Popen(NSQCLI + ["to-file", topic, "--output-dir", str(tmp_path), "--json", "--no-live",
                                   "--sync-interval", "0.2s", "--nsqd-tcp-address", nsqd.tcp_address],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    try:
        wait_for(lambda: (channel_stats(nsqd, topic, "nsqcli_to_file") or {}).get("depth", 1) == 0
                 and not channel_stats(nsqd, topic, "nsqcli_to_file")["in_flight_count"], timeout=20)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert out.count(b"\n") == 1
    doc = json.loads(out)
    assert (doc["received"], doc["finished"], doc["topics"][0]["topic"]) == (3, 3, topic)


def test_sandbox_json_is_one_line_and_points_at_running_servers(tmp_path):
    p = subprocess.Popen(NSQCLI + ["sandbox", "--json", "--data-dir", str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=clean_env({k: v for k, v in os.environ.items()
                                                                if k == "NSQCLI_NSQ_BIN"}))
    try:
        line = p.stdout.readline()
        doc = json.loads(line)
        r = run_nsqcli(["pub", "x", "y", "--nsqd-tcp-address", doc["nsqd"][0]["tcp_address"]])
        assert r.returncode == 0, r.stderr
        assert doc["env"]["NSQCLI_NSQD_TCP_ADDRESS"] == doc["nsqd"][0]["tcp_address"]
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and rest == b""


def test_no_pretty_printed_json_anywhere():
    """Every JSON document the CLI writes is one line: no json.dumps(..., indent=...) in the CLI."""
    from pathlib import Path

    import nsqcli.cli

    root = Path(nsqcli.cli.__file__).parent
    offenders = [str(p) for p in root.rglob("*.py") if re.search(r"json\.dumps\([^\n]*indent=", p.read_text())]
    assert offenders == []


# -- --timeout: exit 3 ---------------------------------------------------------------------------

def test_stat_timeout_before_count_exits_3(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    r = run_nsqcli(["stat", topic, "-n", "3", "--interval", "0.5s", "--timeout", "1s", "--json",
                    "--nsqd-http-address", nsqd.http_address])
    one_error_line(r, 3, r"--timeout passed after [0-2] of 3 reports")
    r = run_nsqcli(["stat", topic, "--interval", "0.2s", "--timeout", "1s", "--json",
                    "--nsqd-http-address", nsqd.http_address])  # no count: the deadline ends the run
    assert r.returncode == 0 and r.stdout.count(b"\n") >= 2 and r.stderr == b"", r.stderr


def test_bench_sub_timeout_exits_3(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"x" * 16, topic=topic)  # the topic exists, 1 message of 5
    r = run_nsqcli(["bench", "sub", topic, "-n", "5", "--timeout", "2s", "--nsqd-tcp-address", nsqd.tcp_address])
    one_error_line(r, 3, r"--timeout passed before 'bench sub' was done")
    assert r.stdout == b""


def test_relays_with_a_count_exit_3_when_the_timeout_passes_first(nsqd, topic):
    """to-nsq and to-http with -n wait for N messages: --timeout bounds the wait (exit 3, the
    summary still said, the one message they did take FINed); without -n it just ends the run."""
    http_post(nsqd.http_address, "/pub", b"only one", topic=topic)
    src = ["--nsqd-tcp-address", nsqd.tcp_address]
    with http_sink() as url:
        for argv, done in ((["to-nsq", topic, "--destination-nsqd-tcp-address", nsqd.tcp_address,
                             "--destination-topic", topic + "_copy"], "copied"),
                           (["to-http", topic, "--post", url], "delivered")):
            r = run_nsqcli([*argv, *src, "-n", "3", "--timeout", "2s", "--json", "--log-format", "plain"])
            one_error_line(r, 3, rf"--timeout passed after [01] of 3 messages {done}")
            # the deadline counts from process start; the run's own clock starts after start-up
            assert json.loads(r.stdout)["elapsed"] >= 1.5, r.stdout
            r = run_nsqcli([*argv, *src, "--timeout", "1s", "--json"])
            assert r.returncode == 0 and json.loads(r.stdout), r.stderr


@pytest.mark.parametrize("cmd", [["stat"], ["bench", "sub"], ["to-nsq", "x"], ["to-http", "x"], ["mpub", "-t", "x"],
                                 ["lookup", "x"], ["doctor"], ["topic", "pause", "x"]])
def test_timeout_zero_is_refused(cmd):
    one_error_line(run_nsqcli([*cmd, "--timeout", "0"]), 2, r"'--timeout': must be more than 0")


# -- help and did-you-mean -----------------------------------------------------------------------

def _all_commands():
    from nsqcli.cli import COMMANDS

    names = [[n] for n in COMMANDS]
    return names + [["topic", "create"], ["channel", "empty"], ["node", "tombstone"], ["bench", "sub"],
                    ["context", "add"]]


@pytest.mark.parametrize("path", _all_commands(), ids=lambda p: " ".join(p))
def test_help_command_shows_the_same_as_dash_dash_help(path):
    from nsqcli.cli import cli

    runner = CliRunner()
    a, b = runner.invoke(cli, ["help", *path], prog_name="nsqcli"), runner.invoke(cli, [*path, "--help"], prog_name="nsqcli")
    assert a.exit_code == b.exit_code == 0, (a.output, b.output)
    assert a.output == b.output and "Usage: nsqcli " + " ".join(path) in a.output


def test_help_alone_is_the_root_help():
    from nsqcli.cli import cli

    runner = CliRunner()
    a = runner.invoke(cli, ["help"], prog_name="nsqcli").output
    assert a == runner.invoke(cli, ["--help"], prog_name="nsqcli").output and "help" in a


@pytest.mark.parametrize("args,pattern", [
    (["tial"], r"^nsqcli: error: No such command 'tial'\. Did you mean 'tail'\? \(see 'nsqcli --help'\)$"),
    (["topic", "craete", "x"], r"No such command 'craete'\. Did you mean 'create'\?"),
    (["bench", "sbu"], r"No such command 'sbu'\. Did you mean 'sub'\?"),
    (["help", "tial"], r"No such command 'tial'\. Did you mean 'tail'\?"),
    (["help", "topic", "craete"], r"No such command 'craete'\. Did you mean 'create'\?"),
    (["qqqqq"], r"No such command 'qqqqq'"),
])
def test_unknown_command_is_one_line_with_a_suggestion(args, pattern):
    one_error_line(run_nsqcli(args), 2, pattern)


def test_an_unknown_command_loads_no_command_module():
    code = ("import sys; from nsqcli.cli import cli; from nsqcli.cli.app import run\n"
            "try:\n    run(cli, ['tial'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('nsqcli.cli.commands.')))")
    r = subprocess.run([*NSQCLI[:1], "-c", code], capture_output=True, env=clean_env(), timeout=30)
    assert r.stdout.strip() == b"[]", r.stdout


# -- one line per failure ------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["lookup"], ["lookup", "t"], ["stat", "-n", "1"], ["stat", "t", "-n", "1"], ["pub", "t", "x"],
    ["tail", "t", "--timeout", "5s"], ["topic", "create", "t"],
], ids=lambda a: " ".join(a))
def test_an_unreachable_lookupd_is_said_once(args):
    one_error_line(run_nsqcli([*args, "--lookupd-http-address", DEAD]), 1, r"127\.0\.0\.1:1")


# -- a declined confirmation ---------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["topic", "delete", "{t}"], ["channel", "empty", "{t}", "ch"]])
def test_declined_confirmation_exits_1_and_changes_nothing(argv, nsqd, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="ch")
    http_post(nsqd.http_address, "/pub", b"y", topic=topic)
    master, slave = pty.openpty()
    p = subprocess.Popen(NSQCLI + [a.format(t=topic) for a in argv] + ["--nsqd-http-address", nsqd.http_address],
                         stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=clean_env())
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 20
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 4096)
    os.write(master, b"n\n")
    p.wait(timeout=20)
    try:
        while chunk := os.read(master, 4096):
            seen += chunk
    except OSError:
        pass
    os.close(master)
    assert p.returncode == 1, seen
    assert b"nsqcli: error: not confirmed" in seen and b"Traceback" not in seen
    assert topic_stats(nsqd, topic) is not None and channel_stats(nsqd, topic, "ch")["depth"] == 1
