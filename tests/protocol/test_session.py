"""The handshake state machine, pure: frames in, actions out."""

import json

import pytest

from nsqcli.errors import AuthError, ConnectError, RemoteProtocolError, ServerError
from nsqcli.protocol.commands import NOP
from nsqcli.protocol.constants import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from nsqcli.protocol.session import Handshake, Upgrade, check_ok, parse_identify_reply

ASK = {"feature_negotiation": True, "tls_v1": False, "snappy": False, "deflate": False, "deflate_level": 6}


def reply(**features) -> bytes:
    return json.dumps({"max_rdy_count": 2500, "msg_timeout": 60000, "version": "1.3.0", **features}).encode()


def test_plain_handshake_with_sub():
    hs = Handshake(ASK, subscribe=("t", "c"))
    assert hs.start().startswith(b"  V2IDENTIFY\n")
    assert hs.receive_frame(FRAME_RESPONSE, reply(max_rdy_count=100, msg_timeout=5000)) == [b"SUB t c\n"]
    assert hs.waiting_for == "SUB" and not hs.done
    assert hs.receive_frame(FRAME_RESPONSE, b"OK") == []
    assert hs.done and hs.negotiated.max_rdy_count == 100 and hs.negotiated.msg_timeout == 5.0


def test_plain_ok_reply_means_defaults_and_no_sub_means_ready():
    hs = Handshake(ASK)
    hs.start()
    assert hs.receive_frame(FRAME_RESPONSE, b"OK") == [] and hs.done
    assert hs.negotiated.max_rdy_count == 2500


def test_tls_then_deflate_then_auth_then_sub_in_order():
    ask = dict(ASK, tls_v1=True, deflate=True)
    hs = Handshake(ask, auth_secret="s3cret", subscribe=("t", "c"))
    hs.start()
    assert hs.receive_frame(FRAME_RESPONSE, reply(tls_v1=True, deflate=True, deflate_level=3,
                                                  auth_required=True)) == [Upgrade("tls")]
    assert hs.receive_frame(FRAME_RESPONSE, b"OK") == [Upgrade("deflate", 3)]
    [auth] = hs.receive_frame(FRAME_RESPONSE, b"OK")
    assert auth == b"AUTH\n\x00\x00\x00\x06s3cret"
    assert hs.receive_frame(FRAME_RESPONSE, b'{"identity":"me","permission_count":1}') == [b"SUB t c\n"]
    assert hs.auth_info["identity"] == "me"
    hs.receive_frame(FRAME_RESPONSE, b"OK")
    assert hs.done


def test_heartbeat_during_handshake_is_answered():
    hs = Handshake(ASK, subscribe=("t", "c"))
    hs.start()
    assert hs.receive_frame(FRAME_RESPONSE, b"_heartbeat_") == [NOP]
    assert hs.waiting_for == "IDENTIFY"


@pytest.mark.parametrize("bad", [b"{not json", b"[1,2]", b'"x"', reply(msg_timeout="x"),
                                 reply(max_rdy_count="abc"), reply(max_rdy_count=0), reply(max_rdy_count=True),
                                 reply(snappy="yes"), reply(version=5), reply(snappy=True),
                                 reply(deflate=True), reply(tls_v1=True)])
def test_bad_identify_replies_are_protocol_errors(bad):
    with pytest.raises(RemoteProtocolError):
        parse_identify_reply(bad, ASK)


def test_snappy_and_deflate_together_refused():
    with pytest.raises(RemoteProtocolError, match="both"):
        parse_identify_reply(reply(snappy=True, deflate=True), dict(ASK, snappy=True, deflate=True))


def test_tls_asked_but_not_offered_fails_before_any_secret_is_sent():
    hs = Handshake(dict(ASK, tls_v1=True), auth_secret="s", subscribe=("t", "c"), address="a:1")
    hs.start()
    with pytest.raises(ConnectError, match="TLS was asked for"):
        hs.receive_frame(FRAME_RESPONSE, reply(auth_required=True))


def test_auth_required_without_secret():
    hs = Handshake(ASK, address="a:1")
    hs.start()
    with pytest.raises(AuthError, match="requires authentication") as e:
        hs.receive_frame(FRAME_RESPONSE, reply(auth_required=True))
    assert e.value.code == "E_AUTH_REQUIRED"


def test_error_and_message_frames_and_non_ok():
    hs = Handshake(ASK, subscribe=("t", "c"), address="a:1")
    hs.start()
    with pytest.raises(ServerError, match="E_INVALID"):
        hs.receive_frame(FRAME_ERROR, b"E_INVALID nope")
    hs = Handshake(ASK, subscribe=("t", "c"))
    hs.start()
    with pytest.raises(RemoteProtocolError, match="message frame during IDENTIFY"):
        hs.receive_frame(FRAME_MESSAGE, b"x" * 30)
    hs = Handshake(ASK, subscribe=("t", "c"), address="a:1")
    hs.start()
    hs.receive_frame(FRAME_RESPONSE, b"OK")
    with pytest.raises(RemoteProtocolError, match="^a:1: nsqd is closing"):
        hs.receive_frame(FRAME_RESPONSE, b"CLOSE_WAIT")


def test_check_ok():
    check_ok(b"OK", "PUB")
    with pytest.raises(RemoteProtocolError, match="expected OK after PUB"):
        check_ok(b"WHAT", "PUB")
