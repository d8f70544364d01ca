"""The frame decoder fed whole, one byte at a time, with trailing bytes, and with garbage."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqcli.errors import RemoteProtocolError
from nsqcli.protocol import (FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, NEED_DATA, Frame,
                             FrameDecoder, Message, decode_message)

MID = b"0123456789abcdef"


def frame(ftype: int, data: bytes) -> bytes:
    return struct.pack(">lL", len(data) + 4, ftype) + data


def msg_payload(body=b"hello", ts=1_700_000_000_123_456_789, attempts=1, mid=MID) -> bytes:
    return struct.pack(">qH16s", ts, attempts, mid) + body


RESPONSE = frame(FRAME_RESPONSE, b"OK")
ERROR = frame(FRAME_ERROR, b"E_BAD_TOPIC PUB topic name 'x y' is not valid")
MESSAGE = frame(FRAME_MESSAGE, msg_payload())
STREAM = RESPONSE + ERROR + MESSAGE + frame(FRAME_RESPONSE, b"_heartbeat_")
EXPECTED = [Frame(0, b"OK"), Frame(1, b"E_BAD_TOPIC PUB topic name 'x y' is not valid"),
            Frame(2, msg_payload()), Frame(0, b"_heartbeat_")]


def drain(dec):
    out = []
    while (f := dec.next_frame()) is not NEED_DATA:
        out.append(f)
    return out


def test_whole():
    dec = FrameDecoder()
    dec.receive_data(STREAM)
    assert drain(dec) == EXPECTED
    assert dec.buffered == 0


def test_one_byte_at_a_time():
    dec = FrameDecoder()
    out = []
    for i in range(len(STREAM)):
        dec.receive_data(STREAM[i:i + 1])
        out += drain(dec)
    assert out == EXPECTED


def test_trailing_bytes_stay_buffered():
    dec = FrameDecoder()
    dec.receive_data(STREAM + RESPONSE[:5])
    assert drain(dec) == EXPECTED
    assert dec.buffered == 5
    assert dec.take_buffered() == RESPONSE[:5]
    assert dec.buffered == 0


def test_decode_all_gives_messages_and_frames():
    dec = FrameDecoder()
    dec.receive_data(STREAM + MESSAGE[:10])
    out = dec.decode_all()
    assert [type(x) for x in out] == [Frame, Frame, Message, Frame]
    m = out[2]
    assert (m.id, m.body, m.attempts, m.timestamp) == (MID, b"hello", 1, 1_700_000_000_123_456_789)
    assert dec.buffered == 10
    dec.receive_data(MESSAGE[10:])
    (m2,) = dec.decode_all()
    assert m2.body == b"hello"


def test_decode_all_one_byte_at_a_time():
    dec = FrameDecoder()
    out = []
    for i in range(len(STREAM)):
        dec.receive_data(STREAM[i:i + 1])
        out += dec.decode_all()
    assert [x.body if isinstance(x, Message) else x for x in out] == [
        EXPECTED[0], EXPECTED[1], b"hello", EXPECTED[3]]


def test_attempts_is_unsigned():
    m = decode_message(msg_payload(attempts=65535))
    assert m.attempts == 65535
    dec = FrameDecoder()
    dec.receive_data(frame(FRAME_MESSAGE, msg_payload(attempts=40000)))
    assert dec.decode_all()[0].attempts == 40000


def test_oversize_frame_refused_before_allocating():
    dec = FrameDecoder(max_frame_size=1024)
    dec.receive_data(struct.pack(">lL", 10_000_000, FRAME_RESPONSE))
    with pytest.raises(RemoteProtocolError, match="invalid frame size 10000000"):
        dec.next_frame()
    with pytest.raises(RemoteProtocolError):  # stays failed
        dec.decode_all()


def test_http_garbage_detected():
    dec = FrameDecoder()
    dec.receive_data(b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\r\n")
    with pytest.raises(RemoteProtocolError, match="looks like an HTTP server"):
        dec.decode_all()


def test_unknown_frame_type():
    dec = FrameDecoder()
    dec.receive_data(frame(7, b"zz"))
    with pytest.raises(RemoteProtocolError, match="unknown frame type 7"):
        dec.next_frame()


def test_short_message_frame():
    dec = FrameDecoder()
    dec.receive_data(frame(FRAME_MESSAGE, b"short"))
    with pytest.raises(RemoteProtocolError, match="shorter than the 26-byte header"):
        dec.decode_all()
    with pytest.raises(RemoteProtocolError, match="shorter than the 26-byte header"):
        decode_message(b"short")


def test_good_frames_before_garbage_are_delivered():
    dec = FrameDecoder()
    dec.receive_data(RESPONSE + frame(9, b""))
    assert dec.decode_all() == [Frame(0, b"OK")]
    with pytest.raises(RemoteProtocolError):
        dec.decode_all()


messages = st.builds(Message, id=st.binary(min_size=16, max_size=16), body=st.binary(max_size=300),
                     timestamp=st.integers(-2**63, 2**63 - 1), attempts=st.integers(0, 65535))


@settings(max_examples=200, deadline=None)
@given(msgs=st.lists(messages, max_size=20), cuts=st.lists(st.integers(1, 50), max_size=40))
def test_roundtrip_any_split(msgs, cuts):
    stream = b"".join(frame(FRAME_MESSAGE, m.encode()) for m in msgs)
    dec = FrameDecoder()
    out, pos = [], 0
    for c in cuts + [len(stream)]:
        dec.receive_data(stream[pos:pos + c])
        pos += c
        out += dec.decode_all()
    dec.receive_data(stream[pos:])
    out += dec.decode_all()
    assert [(m.id, m.body, m.timestamp, m.attempts) for m in out] == \
           [(m.id, m.body, m.timestamp, m.attempts) for m in msgs]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_protocol_error(data):
    for method in ("next_frame", "decode_all"):
        dec = FrameDecoder(max_frame_size=4096)
        dec.receive_data(data)
        try:
            for _ in range(100):
                r = getattr(dec, method)()
                if r is NEED_DATA or r == []:
                    break
        except RemoteProtocolError:
            pass


def test_client_message_decoded_like_constructed():
    """decode_all makes messages without __init__ (hot path): every slot the client's Message
    has must still be set, exactly as its constructor sets it."""
    from nsqcli.client.message import Message as ClientMessage

    handle = object()
    dec = FrameDecoder()
    dec.receive_data(MESSAGE + RESPONSE + frame(FRAME_MESSAGE, msg_payload(b"", attempts=65535)))
    got = [x for x in dec.decode_all(handle, ClientMessage) if type(x) is ClientMessage]
    want = [ClientMessage(MID, b"hello", 1_700_000_000_123_456_789, 1, handle),
            ClientMessage(MID, b"", 1_700_000_000_123_456_789, 65535, handle)]
    slots = [s for cls in ClientMessage.__mro__ for s in getattr(cls, "__slots__", ())]
    assert len(slots) == 7
    for g, w in zip(got, want, strict=True):
        assert {s: getattr(g, s) for s in slots} == {s: getattr(w, s) for s in slots}
    plain = FrameDecoder()
    plain.receive_data(MESSAGE)
    (m,) = plain.decode_all()
    assert type(m) is Message and (m.id, m.body, m.attempts) == (MID, b"hello", 1)


def test_big_frame_in_small_pieces_is_joined_once():
    """A frame arriving in many recvs is not re-joined on every one (that was quadratic)."""
    body = b"z" * 200_000
    data = frame(FRAME_MESSAGE, msg_payload(body)) + RESPONSE
    dec = FrameDecoder()
    dec.receive_data(data[:100])
    assert dec.decode_all() == []
    pieces = 0
    for i in range(100, len(data) - 1000, 1000):
        dec.receive_data(data[i:i + 1000])
        assert dec.decode_all() == []
        pieces += 1
    assert len(dec._chunks) == pieces + 1  # kept as received: the header said how much is needed
    dec.receive_data(data[100 + pieces * 1000:])
    out = dec.decode_all()
    assert [type(x) for x in out] == [Message, Frame] and out[0].body == body
    assert dec.buffered == 0


frames_or_messages = st.one_of(
    messages.map(lambda m: (m, frame(FRAME_MESSAGE, m.encode()))),
    st.binary(max_size=40).map(lambda d: (Frame(FRAME_RESPONSE, d), frame(FRAME_RESPONSE, d))),
    st.binary(max_size=40).map(lambda d: (Frame(FRAME_ERROR, d), frame(FRAME_ERROR, d))))


@settings(max_examples=200, deadline=None)
@given(items=st.lists(frames_or_messages, max_size=20), cuts=st.lists(st.integers(1, 60), max_size=40))
def test_decode_splits_like_decode_all_and_counts_body_bytes(items, cuts):
    """decode() (the hot path) gives decode_all's items apart - messages, other frames - each
    in order, and the exact bytes of the bodies, for any split of the stream."""
    stream = b"".join(wire for _, wire in items)
    dec = FrameDecoder()
    msgs, frames, nbytes, pos = [], [], 0, 0
    for c in cuts + [len(stream)]:
        dec.receive_data(stream[pos:pos + c])
        pos += c
        m, f, b = dec.decode()
        assert b == sum(len(x.body) for x in m)
        msgs += m
        frames += f
        nbytes += b
    want = [x for x, _ in items]
    assert [(m.id, m.body, m.timestamp, m.attempts) for m in msgs] == \
           [(m.id, m.body, m.timestamp, m.attempts) for m in want if type(m) is not Frame]
    assert frames == [f for f in want if type(f) is Frame]
    assert nbytes == sum(len(m.body) for m in want if type(m) is not Frame)
    assert dec.buffered == 0


def test_decode_hands_over_good_frames_before_garbage():
    dec = FrameDecoder()
    dec.receive_data(MESSAGE + RESPONSE + frame(9, b""))
    msgs, frames, nbytes = dec.decode()
    assert [m.body for m in msgs] == [b"hello"] and frames == [Frame(0, b"OK")] and nbytes == 5
    with pytest.raises(RemoteProtocolError, match="unknown frame type 9"):
        dec.decode()


def test_next_frame_over_many_buffered_frames_is_linear():
    """next_frame() one frame at a time over a buffer of 40,000 frames: the rest of the buffer
    is not copied for every frame (that was quadratic: 4 MB took seconds). Counted: the bytes
    copied in all stay below twice the buffer."""
    copied = []

    class Counting(FrameDecoder):
        def _keep(self, buf, off):
            if 0 < len(buf) - off < off:  # (the branch of _keep that copies the rest)
                copied.append(len(buf) - off)
            super()._keep(buf, off)

    data = RESPONSE * 40_000
    dec = Counting()
    dec.receive_data(data)
    out = drain(dec)
    assert len(out) == 40_000 and set(out) == {Frame(0, b"OK")} and dec.buffered == 0
    assert sum(copied) < 2 * len(data)


def test_memoryview_of_wider_items_counts_bytes():
    import array

    payload = frame(FRAME_RESPONSE, b"12345678")  # 16 bytes
    dec = FrameDecoder()
    dec.receive_data(memoryview(array.array("I", payload)))
    assert dec.buffered == 16
    assert dec.decode_all() == [Frame(0, b"12345678")]


def test_a_message_subclass_without_a_responder_decodes():
    class Mine(Message):
        __slots__ = ()

    dec = FrameDecoder()
    dec.receive_data(MESSAGE)
    (m,) = dec.decode_all(message=Mine)
    assert type(m) is Mine and m.body == b"hello"
