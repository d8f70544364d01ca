"""`nsqcli to-parquet`'s refusals: one line, exit 2, before Spark starts (the runs themselves:
tests/spark/test_spark_commands.py, Spark-marked)."""

from __future__ import annotations

import pytest
from tests.support.refusals import bad_input, grammar_row, ids

BAD_INPUT = [
    (["to-parquet", "-t", "t", "-o", "/tmp/x"], 2, r"Missing option '--checkpoint'"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


GRAMMAR = [
    (["to-parquet", "-o", "/tmp/x", "--checkpoint", "/tmp/y"], 2, r"missing TOPIC \(nsqcli to-parquet TOPIC\.\.\."),
]


@pytest.mark.parametrize("args,code,pattern", GRAMMAR, ids=ids(GRAMMAR))
def test_grammar_row(args, code, pattern):
    grammar_row(args, code, pattern)
