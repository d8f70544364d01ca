"""`nsqcli replay`'s refusals: one line, exit 2, before Spark starts (the runs themselves:
tests/spark/test_spark_commands.py, Spark-marked)."""

from __future__ import annotations

import pytest
from tests.support.refusals import FILE, bad_input, grammar_row, ids

BAD_INPUT = [
    (["replay"], 2, r"missing TOPIC \(nsqcli replay TOPIC ARCHIVE\.\.\., or -t TOPIC\)"),
    (["replay", "/nonexistent", "-t", "t"], 2, r"/nonexistent"),
    (["replay", FILE, "-t", "t", "--since", "2h", "--until", "3h"], 2, r"--since must be before --until"),
    (["replay", FILE, "-t", "t", "--since", "yesterday"], 2, r"'yesterday' is not a time"),
    (["replay", FILE, "-t", "t", "--conf", "novalue"], 2, r"--conf"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["replay", "t"], 2, r"missing ARCHIVE"),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)
