"""NSQCLI_* variables: a typo is said (with the name it resembles), the known set is complete."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import run_nsqcli

from nsqcli.defaults import KNOWN

PKG = Path(__file__).resolve().parents[2] / "nsqcli"


def test_a_mistyped_variable_is_said_with_the_name_it_resembles():
    r = run_nsqcli(["pub", "t", "x", "--nsqd-tcp-address", "127.0.0.1:1", "--timeout", "1s"],
                   env_addr={"NSQCLI_NSQD_TCP_ADRESS": "127.0.0.1:4150"})
    lines = r.stderr.decode().splitlines()
    assert lines[0] == ("nsqcli: warning: NSQCLI_NSQD_TCP_ADRESS is set but nsqcli reads no such variable "
                        "(did you mean NSQCLI_NSQD_TCP_ADDRESS?)"), lines
    assert r.returncode == 1 and len(lines) == 2, lines  # and the command still runs (refused connection)


def test_every_variable_the_source_names_is_known():
    named = set()
    for path in (p for p in PKG.rglob("*.py") if p != PKG / "cli" / "envvars.py"):  # (a typo on purpose there)
        named |= set(re.findall(r"\bNSQCLI_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert named - KNOWN == set()
