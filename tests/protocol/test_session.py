"""The connection as a pure state machine: the handshake (frames in, actions out), then the Session
(commands in, events out; publishes matched to their answers), with a stateful property test."""

import json
import struct

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsqcli.errors import AuthError, ConnectError, LocalProtocolError, RemoteProtocolError, ServerError
from nsqcli.protocol.commands import NOP
from nsqcli.protocol.constants import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from nsqcli.protocol.frames import Frame, FrameDecoder
from nsqcli.protocol.session import (CLOSE_WAIT_EVENT, MUST_CLOSE, NOT_PROCESSED, UNKNOWN, Answered, Handshake,
                                     ServerErrorEvent, Session, Unanswered, Upgrade, check_ok, parse_identify_reply,
                                     refused_identify_field)

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


# -- after the handshake: the Session -------------------------------------------------------------
def wire(ftype: int, data: bytes) -> bytes:
    return struct.pack(">lL", len(data) + 4, ftype) + data


def msg_frame(n: int) -> bytes:
    return wire(FRAME_MESSAGE, struct.pack(">qH16s", 1, 1, b"%016d" % n) + b"body%d" % n)


def test_session_matches_publishes_in_order_and_fails_the_rest_after_a_fatal_error():
    s = Session("n:1")
    for t in ("a", "b", "c"):
        assert s.send(b"PUB t\n\x00\x00\x00\x01x", t).startswith(b"PUB")
    assert s.send(b"FIN 0123456789abcdef\n") and s.waiting == 3
    s.flushed()
    d = FrameDecoder()
    d.receive_data(wire(FRAME_RESPONSE, b"OK") + wire(FRAME_RESPONSE, b"_heartbeat_")
                   + wire(FRAME_ERROR, b"E_FIN_FAILED FIN failed") + wire(FRAME_ERROR, b"E_BAD_BODY too big"))
    msgs, events = s.receive(d.decode_all())
    assert msgs == [] and s.data_to_send() == [b"NOP\n"] and s.heartbeats == 1
    assert [type(e) for e in events] == [Answered, ServerErrorEvent, Answered, Unanswered]
    assert events[0].token == "a" and events[0].error is None
    assert events[1].error.code == "E_FIN_FAILED" and not events[1].fatal
    assert events[2].token == "b" and events[2].error.code == "E_BAD_BODY"
    assert events[3].token == "c" and events[3].reason == NOT_PROCESSED
    assert s.state == MUST_CLOSE
    with pytest.raises(LocalProtocolError):
        s.send(b"PUB t\n\x00\x00\x00\x01x", "d")


def test_session_refuses_an_answer_nobody_asked_for_and_a_publish_without_token():
    s = Session("n:1")
    with pytest.raises(LocalProtocolError, match="token"):
        s.send(b"MPUB t\n\x00\x00\x00\x04\x00\x00\x00\x00")
    with pytest.raises(RemoteProtocolError, match="unexpected response"):
        s.receive([Frame(FRAME_RESPONSE, b"OK")])
    s.send(b"PUB t\n\x00\x00\x00\x01x", "queued, not written")
    with pytest.raises(RemoteProtocolError, match="unexpected response"):  # came before the PUB was written
        s.receive([Frame(FRAME_RESPONSE, b"OK")])


def test_a_message_on_a_connection_that_did_not_subscribe_is_a_protocol_error():
    d = FrameDecoder()
    d.receive_data(msg_frame(1))
    with pytest.raises(RemoteProtocolError, match="did not subscribe"):
        Session("n:1").receive(d.decode_all())
    d.receive_data(msg_frame(2))
    msgs, _ = Session("n:1", subscribed=True).receive(d.decode_all())
    assert [m.body for m in msgs] == [b"body2"]


def test_a_stray_message_fails_before_any_answer_is_taken():
    """An OK read with the stray message is not matched to a publish: every publish written
    stays unknown (nsqd may have published it), none is reported published or lost."""
    s = Session("n:1")
    s.send(b"PUB t\n\x00\x00\x00\x01x", "p1")
    s.flushed()
    d = FrameDecoder()
    d.receive_data(wire(FRAME_RESPONSE, b"OK") + msg_frame(3))
    msgs, frames, _ = d.decode()
    with pytest.raises(RemoteProtocolError, match="did not subscribe"):
        s.receive_frames(frames, bool(msgs))
    assert [(e.token, e.reason) for e in s.connection_lost()] == [("p1", "unknown")]


def test_connection_lost_tells_written_from_never_written_publishes():
    s = Session()
    s.send(b"PUB t\n\x00\x00\x00\x01x", "written")
    s.flushed()
    s.send(b"PUB t\n\x00\x00\x00\x01x", "queued")
    assert s.tokens() == ["written", "queued"]
    assert [(e.token, e.reason) for e in s.connection_lost()] == [("written", UNKNOWN), ("queued", NOT_PROCESSED)]


def test_close_wait_after_cls_and_connection_lost():
    s = Session()
    s.send(b"DPUB t 10\n\x00\x00\x00\x01x", 1)
    s.flushed()
    s.send(b"CLS\n")
    s.send(b"FIN 0123456789abcdef\n")  # after CLS, in-flight messages are still answered
    _, events = s.receive([Frame(FRAME_RESPONSE, b"CLOSE_WAIT")])
    assert events == [CLOSE_WAIT_EVENT] and s.waiting == 1
    assert [(e.token, e.reason) for e in s.connection_lost()] == [(1, UNKNOWN)]


class SessionMachine(RuleBasedStateMachine):
    """The session against a FIFO model, fed through the frame decoder in random splits."""

    def __init__(self):
        super().__init__()
        self.s = Session("n:1", subscribed=True)
        self.decoder = FrameDecoder()
        self.queued: list[int] = []        # sent, not written yet
        self.pending: list[int] = []       # written, waiting for the answer
        self.resolved: list[int] = []      # tokens in the order they were resolved
        self.sent = 0
        self.dead = False                  # fatal error seen or connection lost
        self.cls = False
        self.heartbeats = 0
        self.messages = 0
        self.received: list[bytes] = []

    def _feed(self, data: bytes, cut: int) -> tuple[list, list]:
        cut = min(cut, len(data))
        self.decoder.receive_data(data[:cut])
        first = self.s.receive(self.decoder.decode_all())
        self.decoder.receive_data(data[cut:])
        second = self.s.receive(self.decoder.decode_all())
        return first[0] + second[0], first[1] + second[1]

    def _resolve(self, events) -> None:
        for e in events:
            if type(e) in (Answered, Unanswered):
                self.resolved.append(e.token)

    @precondition(lambda self: not self.dead)
    @rule(kind=st.sampled_from([b"PUB t\n", b"MPUB t\n", b"DPUB t 5\n"]))
    def publish(self, kind):
        self.sent += 1
        self.s.send(kind + b"\x00\x00\x00\x01x", self.sent)
        self.queued.append(self.sent)

    @rule()
    def flush(self):
        self.s.flushed()
        self.pending += self.queued
        self.queued = []

    @precondition(lambda self: not self.dead and not self.pending)
    @rule(cut=st.integers(0, 12))
    def stray_ok(self, cut):
        """An OK when nothing written waits for one (even if publishes are queued)."""
        with pytest.raises(RemoteProtocolError, match="unexpected response"):
            self._feed(wire(FRAME_RESPONSE, b"OK"), cut)
        self.decoder = FrameDecoder()  # the stream is broken now; start a fresh one

    @precondition(lambda self: not self.dead)
    @rule(cmd=st.sampled_from([b"FIN 0123456789abcdef\n", b"RDY 5\n", b"NOP\n", b"TOUCH 0123456789abcdef\n"]))
    def unanswered_command(self, cmd):
        assert self.s.send(cmd) == cmd
        assert self.s.waiting == len(self.pending) + len(self.queued)

    @precondition(lambda self: not self.dead and self.pending)
    @rule(cut=st.integers(0, 12))
    def ok(self, cut):
        _, events = self._feed(wire(FRAME_RESPONSE, b"OK"), cut)
        assert len(events) == 1 and events[0].token == self.pending.pop(0) and events[0].error is None
        self._resolve(events)

    @precondition(lambda self: not self.dead)
    @rule(code=st.sampled_from([b"E_BAD_BODY", b"E_MPUB_FAILED", b"E_INVALID"]), cut=st.integers(0, 30))
    def fatal_error(self, code, cut):
        _, events = self._feed(wire(FRAME_ERROR, code + b" no"), cut)
        if self.pending:
            head, rest = self.pending[0], self.pending[1:] + self.queued
            assert type(events[0]) is Answered and events[0].token == head and events[0].error.code == code.decode()
        else:
            rest = self.queued
            assert type(events[0]) is ServerErrorEvent and events[0].fatal
        assert [(type(e), e.token, e.reason) for e in events[1:]] == [(Unanswered, t, NOT_PROCESSED) for t in rest]
        self._resolve(events)
        self.pending, self.queued = [], []
        self.dead = True

    @precondition(lambda self: not self.dead)
    @rule(cut=st.integers(0, 30))
    def non_fatal_error(self, cut):
        _, events = self._feed(wire(FRAME_ERROR, b"E_REQ_FAILED late"), cut)
        assert [type(e) for e in events] == [ServerErrorEvent] and not events[0].fatal

    @precondition(lambda self: not self.dead)
    @rule(cut=st.integers(0, 20))
    def heartbeat(self, cut):
        _, events = self._feed(wire(FRAME_RESPONSE, b"_heartbeat_"), cut)
        self.heartbeats += 1
        assert events == [] and self.s.data_to_send() == [b"NOP\n"]

    @precondition(lambda self: not self.dead)
    @rule(cut=st.integers(0, 60))
    def message(self, cut):
        self.messages += 1
        msgs, events = self._feed(msg_frame(self.messages), cut)
        assert events == [] and [m.body for m in msgs] == [b"body%d" % self.messages]

    @precondition(lambda self: not self.dead and not self.cls)
    @rule()
    def close_politely(self):
        self.s.send(b"CLS\n")
        self.cls = True
        _, events = self._feed(wire(FRAME_RESPONSE, b"CLOSE_WAIT"), 3)
        assert events == [CLOSE_WAIT_EVENT]

    @rule()
    def connection_lost(self):
        events = self.s.connection_lost()
        assert [(e.token, e.reason) for e in events] == ([(t, UNKNOWN) for t in self.pending]
                                                         + [(t, NOT_PROCESSED) for t in self.queued])
        self._resolve(events)
        self.pending, self.queued = [], []
        self.dead = True

    @precondition(lambda self: self.dead)
    @rule()
    def nothing_is_sent_after_the_end(self):
        with pytest.raises(LocalProtocolError):
            self.s.send(b"PUB t\n\x00\x00\x00\x01x", -1)

    @invariant()
    def every_publish_is_resolved_once_in_order(self):
        assert self.s.waiting == len(self.pending) + len(self.queued)
        assert self.s.tokens() == self.pending + self.queued
        assert self.resolved == list(range(1, len(self.resolved) + 1))
        assert len(self.resolved) + len(self.pending) + len(self.queued) == self.sent
        assert self.s.heartbeats == self.heartbeats


TestSession = SessionMachine.TestCase
TestSession.settings = settings(max_examples=150, stateful_step_count=40, deadline=None, derandomize=True,
                                database=None)


def test_the_identify_field_nsqd_refused_is_named():
    """nsqd's words for a refused IDENTIFY value (client_v2.go, v1.0-1.3): the connection retries
    without it (output buffer) instead of failing every command."""
    hs = Handshake(ASK, address="n:4150")
    hs.start()
    with pytest.raises(ServerError) as e:
        hs.receive_frame(FRAME_ERROR, b"E_BAD_BODY IDENTIFY output buffer timeout (50) is invalid")
    assert refused_identify_field(e.value) == "output_buffer_timeout"
    cases = {b"E_BAD_BODY IDENTIFY output buffer size (65536) is invalid": "output_buffer_size",
             b"E_BAD_BODY IDENTIFY heartbeat interval (90000) is invalid": "heartbeat_interval",
             b"E_BAD_BODY IDENTIFY sample rate (100) is invalid": "sample_rate",
             b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid": "msg_timeout",
             b"E_BAD_BODY IDENTIFY failed to decode JSON body": None,
             b"E_BAD_BODY MPUB body too big 9 > 5": None,
             b"E_INVALID output buffer timeout (50) is invalid": None}
    from nsqcli.errors import server_error

    for data, field in cases.items():
        assert refused_identify_field(server_error(data, "n:4150")) == field, data
    assert refused_identify_field("E_BAD_BODY IDENTIFY output buffer timeout (9) is invalid") == "output_buffer_timeout"
