"""Golden bytes for every encoder, and the errors bad input must raise."""

import json
import struct

import pytest

from nsqcli.errors import LocalProtocolError
from nsqcli.protocol import (
    MAGIC_V2, encode_auth, encode_cls, encode_dpub, encode_fin, encode_fins, encode_identify, encode_mpub,
    encode_nop, encode_pub, encode_rdy, encode_req, encode_sub, encode_touch,
)

MID = b"0123456789abcdef"


def test_magic():
    assert MAGIC_V2 == b"  V2"


def test_identify_golden():
    out = encode_identify({"client_id": "c", "feature_negotiation": True})
    body = b'{"client_id":"c","feature_negotiation":true}'
    assert out == b"IDENTIFY\n" + struct.pack(">I", len(body)) + body
    assert json.loads(out[13:]) == {"client_id": "c", "feature_negotiation": True}


def test_auth_golden():
    assert encode_auth("s3cret") == b"AUTH\n\x00\x00\x00\x06s3cret"


def test_sub_golden():
    assert encode_sub("t.1", "ch#ephemeral") == b"SUB t.1 ch#ephemeral\n"


def test_pub_golden():
    assert encode_pub("t", b"hello") == b"PUB t\n\x00\x00\x00\x05hello"
    assert encode_pub("t", "é") == b"PUB t\n\x00\x00\x00\x02\xc3\xa9"


def test_dpub_golden():
    assert encode_dpub("t", 1500, b"x") == b"DPUB t 1500\n\x00\x00\x00\x01x"


def test_mpub_golden():
    assert encode_mpub("t", [b"a", b"bc"]) == (
        b"MPUB t\n" + b"\x00\x00\x00\x0f" + b"\x00\x00\x00\x02"
        + b"\x00\x00\x00\x01a" + b"\x00\x00\x00\x02bc")


def test_simple_commands_golden():
    assert encode_rdy(0) == b"RDY 0\n"
    assert encode_rdy(2500) == b"RDY 2500\n"
    assert encode_fin(MID) == b"FIN 0123456789abcdef\n"
    assert encode_fins([MID]) == encode_fin(MID) and encode_fins([]) == b""
    assert encode_fins([MID, b"fedcba9876543210"]) == b"FIN 0123456789abcdef\nFIN fedcba9876543210\n"
    assert encode_req(MID, 0) == b"REQ 0123456789abcdef 0\n"
    assert encode_req(MID, 90000) == b"REQ 0123456789abcdef 90000\n"
    assert encode_touch(MID) == b"TOUCH 0123456789abcdef\n"
    assert encode_cls() == b"CLS\n"
    assert encode_nop() == b"NOP\n"


@pytest.mark.parametrize("call, words", [
    (lambda: encode_rdy(-1), "RDY count out of range: -1"),
    (lambda: encode_rdy(2**31), "RDY count out of range"),
    (lambda: encode_rdy(1.5), "RDY count must be an integer"),
    (lambda: encode_mpub("t", []), "MPUB needs at least one message"),
    (lambda: encode_mpub("t", [b"a", b""]), "message 2 of MPUB is empty"),
    (lambda: encode_pub("t", b""), "message body is empty"),
    (lambda: encode_pub("t", 12), "message body must be bytes or str"),
    (lambda: encode_pub("bad topic", b"x"), "invalid topic name 'bad topic'"),
    (lambda: encode_pub("x" * 65, b"x"), "must be 1-64 characters, got 65"),
    (lambda: encode_sub("t", ""), "invalid channel name ''"),
    (lambda: encode_sub("t", "c#other"), "invalid channel name 'c#other'"),
    (lambda: encode_dpub("t", -5, b"x"), "defer (ms) out of range: -5"),
    (lambda: encode_req(MID, -1), "requeue delay (ms) out of range"),
    (lambda: encode_fin(b"short"), "message id must be 16 bytes, got 5"),
    (lambda: encode_auth(""), "auth secret is empty"),
])
def test_bad_input_names_the_problem(call, words):
    with pytest.raises(LocalProtocolError) as info:
        call()
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)
