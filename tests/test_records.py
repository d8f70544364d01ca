"""Record formats (nsqcli/records.py): templates may name the documented fields and nothing
reached through them; a bad one is refused at start-up, before anything is consumed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tests.support.helpers import channel_stats, http_post, run_nsqcli, topic_stats

from nsqcli.records import FIELDS, Formatter, TemplateError

FORBIDDEN = [
    "{body.__class__}",                            # printed <class 'str'>
    "{body.__class__.__init__.__globals__}",       # reached module globals
    "{body[0]}", "{attempts.real}", "{topic!r} {id[0]}",
    "{body:{id.__class__}}",                       # nested in a format spec
    "{}", "{0}", "{nope}",
]


def message(body=b"hello"):
    """What a consumer hands the formatter: the wire fields and where the message came from."""
    return SimpleNamespace(id=b"0123456789abcdef", body=body, timestamp=1_700_000_000_123_456_789, attempts=3,
                           topic="t", channel="c", nsqd="127.0.0.1:4150")


@pytest.mark.parametrize("fmt", FORBIDDEN)
def test_a_template_names_only_the_documented_fields(fmt):
    with pytest.raises(TemplateError) as e:
        Formatter(fmt)
    assert e.value.field not in FIELDS and "fields: topic, channel, nsqd, id, attempts" in str(e.value)


@pytest.mark.parametrize("fmt,why", [("{body:d}", "Unknown format code 'd'"), ("{body!x}", "conversion"),
                                     ("{", "Single '{'")])
def test_a_template_that_cannot_format_is_refused_at_start_up(fmt, why):
    with pytest.raises(TemplateError, match=why):
        Formatter(fmt)


def test_every_documented_field_and_format_specs_still_work():
    fmt = " ".join("{%s}" % f for f in FIELDS) + " [{attempts:03d}] [{body:>7}] {body!r}"
    out = Formatter(fmt)(message())
    assert out == (b"t c 127.0.0.1:4150 0123456789abcdef 3 1700000000123456789 "
                   b"2023-11-14T22:13:20.123456789Z 5 hello 68656c6c6f hello [003] [  hello] 'hello'")


@pytest.mark.parametrize("fmt,field", [("{body.__class__}", "body.__class__"), ("{id[0]}", "id[0]")])
def test_tail_refuses_the_template_before_consuming(nsqd, topic, fmt, field):
    """One stderr line naming the field and the documented ones, exit 2, nothing on stdout,
    no channel created and the message still there."""
    http_post(nsqd.http_address, "/pub", b"keep me", topic=topic)
    r = run_nsqcli(["tail", topic, "-c", "probe", "-n", "1", "--format", fmt,
                    "--nsqd-tcp-address", nsqd.tcp_address])
    lines = r.stderr.decode().splitlines()
    assert (r.returncode, r.stdout, len(lines)) == (2, b"", 1), r.stderr
    assert "Invalid value for '--format'" in lines[0] and f"unknown field {field!r}" in lines[0]
    assert "fields: topic, channel, nsqd, id, attempts, timestamp, time, size, body, body_hex, body_escaped" in lines[0]
    assert channel_stats(nsqd, topic, "probe") is None and topic_stats(nsqd, topic)["depth"] == 1


def test_tail_prints_a_documented_template(nsqd, topic):
    http_post(nsqd.http_address, "/pub", b"hi", topic=topic)
    r = run_nsqcli(["tail", topic, "-c", "c", "-n", "1", "--format", "{topic}:{attempts:02d}:{body}",
                    "--nsqd-tcp-address", nsqd.tcp_address])
    assert (r.returncode, r.stdout) == (0, f"{topic}:01:hi\n".encode()), r.stderr
