"""`nsqcli query`'s refusals: one line, exit 2, before Spark starts (the runs themselves:
tests/spark/test_spark_commands.py, Spark-marked)."""

from __future__ import annotations

import pytest
from tests.support.refusals import FILE, bad_input, ids

BAD_INPUT = [
    (["query", "select 1"], 2, r"Missing option '-a' / '--archive'"),
    (["query", "select 1", "-a", FILE, "--json", "--csv"], 2, r"--json.*--csv"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)
