"""--grep / --where: the expression language (pure) and to-file's filter against real nsqd."""

from __future__ import annotations

import json

import pytest
from tests.support.helpers import channel_stats, http_post, wait_for
from tests.cli.test_to_file import drained, read_records, start, stop

from nsqcli.filters import FilterError, compile_grep, compile_where


class M:
    def __init__(self, body: bytes, attempts: int = 1):
        self.body, self.attempts, self.id = body, attempts, b"0123456789abcdef"
        self.timestamp, self.topic, self.channel, self.nsqd = 1_700_000_000_000_000_000, "t", "c", "n:1"


BODY = json.dumps({"user": {"id": 42, "name": "abby"}, "type": "a", "items": [1, 2, {"k": "v"}],
                   "odd key": True, "n": None}).encode()


@pytest.mark.parametrize("expr, want", [
    (".user.id == 42", True),
    (".user.id == 42 and attempts > 1", False),
    (".user.id == 42 or attempts > 1", True),
    ("size < 1000", True),
    (f"size == {len(BODY)}", True),
    ('.type in ["a", "b"]', True),
    ('.type not in ["a"]', False),
    ('.user.name =~ "^ab"', True),
    (".items[2].k == 'v'", True),
    (".items[-1].k == \"v\"", True),
    ('.["odd key"]', True),
    (".missing == null and .n == null", True),
    (".missing > 3", False),           # null never orders
    ('.user.id == "42"', False),       # no coercion between text and numbers
    (".user.id >= 41.5", True),
    ('not (.type == "b")', True),
    ('"k" in .items[2]', True),
    ('"bb" in .user.name', True),
    ('time > "2023-11-14T22"', True),
    ('id == "0123456789abcdef"', True),
    ("timestamp > 0 and topic == 't' and channel == 'c' and nsqd == 'n:1'", True),
    (".", True),
    (".items", True),
    (".items[7]", False),
])
def test_where_expressions(expr, want):
    assert compile_where(expr)(M(BODY)) is want


def test_where_on_a_body_that_is_not_json_sees_null():
    assert compile_where(".x == null")(M(b"\xff plain")) and not compile_where(".x == 1")(M(b"[1"))
    assert compile_where("size == 3")(M(b"abc"))


@pytest.mark.parametrize("expr, says", [
    ("", "empty expression"),
    (".a ==", "expected a value, found the end at position 6"),
    ("user.id == 1", "unknown name 'user' (message fields: "),
    (".a == 1 1", "unexpected 1 at position 9"),
    ('.a =~ "("', "bad regular expression"),
    ('.a =~ .b', "=~ takes a regular expression in quotes"),
    ('"open', "unexpected '\"'"),
    ("(.a", "expected ')', found the end"),
    ("__import__('os')", "unknown name '__import__'"),
    ("(" * 5000, "nested too deeply"),
])
def test_where_mistakes_say_where(expr, says):
    with pytest.raises(FilterError) as e:
        compile_where(expr)
    assert says in str(e.value) and e.value.option == "--where"


def test_grep_searches_the_bytes():
    assert compile_grep(r"x\d")(M(b"\xff\xfex1")) and not compile_grep("^x")(M(b"ax"))
    assert compile_grep("café")(M("un café".encode())) and compile_grep(r"\xff")(M(b"a\xffb"))
    assert compile_grep("(?i)ERROR|warn")(M(b"an Error")) and not compile_grep("a.b")(M(b"a\nb"))
    with pytest.raises(FilterError, match="invalid --grep"):
        compile_grep("[")


def test_a_pattern_that_backtracks_for_ever_in_python_re_matches_at_once():
    """(a+)+$ on 5,000 "a" and a "!": Python's re would backtrack for ages, holding the GIL so that
    neither SIGTERM nor --timeout could stop the consumer; RE2 is linear in the body."""
    import time

    t = time.monotonic()
    assert not compile_grep("(a+)+$")(M(b"a" * 5000 + b"!"))
    assert not compile_where('.s =~ "(a|aa)+$"')(M(json.dumps({"s": "a" * 5000 + "!"}).encode()))
    assert time.monotonic() - t < 1.0


@pytest.mark.parametrize("pattern, says", [("(?=a)b", "no lookaround"), (r"(a)\1", "no backreferences")])
def test_what_re2_does_not_have_is_refused_naming_the_syntax(pattern, says, capfd):
    with pytest.raises(FilterError, match="invalid --grep") as e:
        compile_grep(pattern)
    assert says in str(e.value) and "RE2" in str(e.value)
    with pytest.raises(FilterError, match=says):
        compile_where(f'.a =~ "{pattern}"'.replace("\\", "\\\\"))
    assert capfd.readouterr().err == ""  # RE2's own log lines are off


def test_where_regex_on_text_with_a_lone_surrogate_does_not_raise():
    body = b'{"s": "ab\\udc80cd"}'  # JSON that decodes to a lone surrogate
    assert compile_where('.s =~ "^ab.cd$"')(M(body))


def test_to_file_writes_only_what_matches_and_fins_the_rest(nsqd, topic, tmp_path):
    out = tmp_path / "out"
    bodies = [json.dumps({"level": "error" if i % 3 == 0 else "info", "i": i}).encode() for i in range(30)]
    http_post(nsqd.http_address, "/mpub", b"\n".join(bodies), topic=topic)
    p = start(["-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(out),
               "--where", '.level == "error"', "--grep", r'"i": [0-9]*[02468]\}', "--sync-interval", "0.2s",
               "--status-interval", "0"])
    try:
        wait_for(lambda: drained(nsqd, topic, total=30), what="all 30 FINed")
    finally:
        rc, _, err = stop(p)
    assert rc == 0, err
    assert read_records(out) == [b for i, b in enumerate(bodies) if i % 6 == 0]
    assert b"25 message(s) did not match --grep/--where and were FINed without being written" in err
    assert channel_stats(nsqd, topic, "nsqcli_to_file")["requeue_count"] == 0


def test_to_file_with_nothing_matching_opens_no_file(nsqd, topic, tmp_path):
    out = tmp_path / "out"
    http_post(nsqd.http_address, "/mpub", b"a\nb\nc", topic=topic)
    p = start(["-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, "--output-dir", str(out),
               "--grep", "zzz", "--sync-interval", "0.2s", "--status-interval", "0"])
    try:
        wait_for(lambda: drained(nsqd, topic, total=3), what="all 3 FINed")
    finally:
        rc, _, err = stop(p)
    assert rc == 0, err
    assert not out.exists() or list(out.iterdir()) == []


def test_to_file_refuses_a_bad_filter(tmp_path):
    p = start(["-t", "x", "--where", ".a ==", "--output-dir", str(tmp_path)])
    _, err = p.communicate(timeout=20)
    assert p.returncode == 2 and b"Invalid value for '--where'" in err and err.count(b"\n") == 1
