"""The run options mean the same thing on every long-running command (to-file, to-nsq, to-http,
tail): the same refusals, one line each, exit 2, before anything connects."""

from __future__ import annotations

import pytest
from tests.support.helpers import run_nsqcli

NSQD = ["--nsqd-tcp-address", "127.0.0.1:1"]  # never reached: every row is refused before connecting
COMMANDS = {
    "tail": ["tail", "t", *NSQD],
    "to-nsq": ["to-nsq", "-t", "t", *NSQD, "--destination-nsqd-tcp-address", "127.0.0.1:2"],
    "to-http": ["to-http", "-t", "t", "--post", "http://127.0.0.1:3/", *NSQD],
    "to-file": ["to-file", "-t", "t", "--output-dir", "OUT", *NSQD],
    "exec": ["exec", "t", "-c", "c", *NSQD],
}
ROWS = [
    (["--idle-timeout", "0"], "'--idle-timeout': must be more than 0", ("tail", "to-nsq", "to-http", "exec")),
    (["--timeout", "0"], "'--timeout': must be more than 0", ("tail", "to-nsq", "to-http", "exec")),
    (["--metrics-address", "nohost"], "'--metrics-address'", tuple(COMMANDS)),
    (["--status-file", "/nonexistent-dir/status.json"], "'--status-file'", tuple(COMMANDS)),
    (["--log-format", "xml"], "'--log-format'", tuple(COMMANDS)),
    (["--log-level", "loud"], "'--log-level'", tuple(COMMANDS)),
]


CASES = [(command, extra, says) for extra, says, where in ROWS for command in where]


@pytest.mark.parametrize("command,extra,says", CASES, ids=[f"{c}:{e[0]}={e[1]}" for c, e, _ in CASES])
def test_the_same_refusal_everywhere(command, extra, says, tmp_path):
    """(to-file runs until stopped: it has no --timeout or --idle-timeout.)"""
    args = [a.replace("OUT", str(tmp_path)) for a in COMMANDS[command]] + extra + (["--", "true"] if command == "exec"
                                                                                  else [])
    r = run_nsqcli(args, timeout=30)
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0], (r.returncode, lines)


def test_to_file_logs_carry_their_time():
    r = run_nsqcli(["to-file", "-t", "t", "--nsqd-tcp-address", "127.0.0.1:1", "--log-format", "plain"], timeout=30)
    assert r.returncode == 2 and "to-file logs as 'text' or 'json'" in r.stderr.decode()
