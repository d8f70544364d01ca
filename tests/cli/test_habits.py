"""Habits from other tools (Go durations, kcat/nsq_tail flags, 'sub') get a way forward, and a few
inputs that used to fail badly are refused in one line (exit 2)."""

from __future__ import annotations

import pytest
from tests.support.helpers import one_error_line, run_nsqcli

ROWS = [
    (["tail", "-f", "events"], r"missing TOPIC .*; -f is --format here, so 'events' was read as the format; "
                               r"tail follows by default: nsqcli tail events"),
    (["tail", "x", "--json"], r"No such option '--json'; for one JSON object a message use -f json \(see"),
    (["tail", "x", "--follow"], r"nsqcli tail follows until stopped; -n N stops after N messages"),
    (["sub", "x"], r"No such command 'sub': to read messages: nsqcli tail TOPIC"),
    (["publish", "x", "y"], r"No such command 'publish': to publish: nsqcli pub TOPIC MESSAGE"),
    (["mpub", "-t", "x", "--rate", "nan"], r"'--rate': 'nan' is not a finite number"),
    (["mpub", "-t", "x", "--rate", "inf"], r"'--rate': 'inf' is not a finite number"),
    (["bench", "pubsub", "-n", "0"], r"'-n' / '--count': 0 is not in the range x>=1"),
    (["tail", "x", "--timeout", "1h30x"], r"'1h30x' is not a duration \(use e\.g\. 500ms, 2s, 1m, 1h30m\)"),
]


@pytest.mark.parametrize("args,pattern", ROWS, ids=[" ".join(r[0]) for r in ROWS])
def test_one_line_with_the_way_forward(args, pattern):
    one_error_line(run_nsqcli(args, timeout=30), 2, pattern)


def test_go_durations_are_durations():
    from nsqcli.clock import parse_duration

    assert parse_duration("1h30m") == 5400 and parse_duration("2h45m30.5s") == 9930.5
    assert parse_duration("250ms") == 0.25 and parse_duration("3") == 3 and parse_duration("1.5m") == 90
    for bad in ("", "h", "1h30", "5x", "-1s", "1d"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_pub_fast_path_takes_a_go_duration(nsqd, topic):
    r = run_nsqcli(["pub", topic, "x", "--timeout", "1m30s", "--nsqd-tcp-address", nsqd.tcp_address])
    assert r.returncode == 0, r.stderr


def test_an_empty_auth_secret_file_is_refused_first(tmp_path):
    empty = tmp_path / "secret"
    empty.write_text("\n")
    empty.chmod(0o644)  # its mode hint would come first if the file were read after the hints
    one_error_line(run_nsqcli(["pub", "t", "x", "--auth-secret-file", str(empty)]), 2,
                   rf"'--auth-secret-file': {empty} is empty: it must hold the secret nsqd's auth server takes")


def test_a_host_identifier_with_a_slash_is_refused(tmp_path):
    one_error_line(run_nsqcli(["to-file", "-t", "t", "--host-identifier", "../../etc", "--output-dir", str(tmp_path),
                               "--nsqd-tcp-address", "127.0.0.1:1"]), 2,
                   r"--host-identifier '\.\./\.\./etc' has a '/': it goes into file names")


def test_a_host_identifier_with_a_newline_is_refused(tmp_path):
    one_error_line(run_nsqcli(["to-file", "-t", "t", "--host-identifier", "a\nb", "--output-dir", str(tmp_path),
                               "--nsqd-tcp-address", "127.0.0.1:1"]), 2,
                   r"--host-identifier 'a\\nb' has a control character: it goes into file names")
