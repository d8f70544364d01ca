"""NSQCLI_* variables: a typo is said (with the name it resembles), the known set is complete."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.helpers import run_nsqcli

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


# -- refusals: a bad NSQCLI_* value is one line, exit 2, nothing sent ------------------------------------
import pytest  # noqa: E402
from tests.support.refusals import FILE, address_footgun, bad_input, ids  # noqa: E402

BAD_ENVIRONMENT = [
    ({"NSQCLI_NSQD_TCP_ADDRESS": "nope"}, ["pub", "t", "x"], 2, r"invalid address 'nope': expected HOST:PORT"),
    ({"NSQCLI_TLS_MIN_VERSION": "9"}, ["pub", "t", "x"], 2, r"'9' is not one of"),
    ({"NSQCLI_CONTEXT": "nope"}, ["pub", "t", "x"], 2, r"no context named 'nope'"),
    ({"NSQCLI_SAMPLE_RATE": "-5"}, ["tail", "t"], 2, r"-5 is not in the range 0<=x<=99"),
    ({"NSQCLI_LOOKUPD_HTTP_ADDRESS": "a:4161,b:4161"}, ["tail", "t"], 2,
     r"NSQCLI_LOOKUPD_HTTP_ADDRESS has a comma list 'a:4161,b:4161': separate several addresses with spaces"),
    ({"NSQCLI_CONFIG_DIR": FILE}, ["pub", "t", "x"], 2, r"NSQCLI_CONFIG_DIR=.* is not a directory"),
]


@pytest.mark.parametrize("env,args,code,pattern", BAD_ENVIRONMENT, ids=[next(iter(c[0])) for c in BAD_ENVIRONMENT])
def test_bad_environment(env, args, code, pattern):
    bad_input(args, code, pattern, env)


ADDRESS_FOOTGUNS = [  # a comma list where the variable takes spaces
    ({"NSQCLI_NSQD_TCP_ADDRESS": "{tcp},{tcp}"}, ["pub", "{t}", "x"],
     r"NSQCLI_NSQD_TCP_ADDRESS has a comma list '{tcp},{tcp}': separate several addresses with spaces "
     r"\(NSQCLI_NSQD_TCP_ADDRESS='{tcp} {tcp}'\)"),
    ({"NSQCLI_NSQD_TCP_ADDRESS": "{tcp}, {tcp}"}, ["tail", "{t}", "-n", "1"],
     r"NSQCLI_NSQD_TCP_ADDRESS has a comma list '{tcp}, {tcp}'.*'{tcp} {tcp}'"),
    ({"NSQCLI_LOOKUPD_HTTP_ADDRESS": "127.0.0.1:4161,127.0.0.1:4162"}, ["pub", "{t}", "x"],
     r"NSQCLI_LOOKUPD_HTTP_ADDRESS has a comma list.*separate several addresses with spaces"),
    ({"NSQCLI_NSQD_HTTP_ADDRESS": "{http},{http}"}, ["stat", "-n", "1"], r"NSQCLI_NSQD_HTTP_ADDRESS has a comma list"),
]


@pytest.mark.parametrize("env,args,pattern", ADDRESS_FOOTGUNS, ids=ids(ADDRESS_FOOTGUNS, at=1, width=50))
def test_address_footgun_is_refused_naming_the_fix(nsqd, topic, env, args, pattern):
    address_footgun(nsqd, topic, env, args, pattern)
