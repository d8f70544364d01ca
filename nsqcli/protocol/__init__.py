"""The pure NSQ TCP protocol: bytes in, bytes out. No sockets, threads, clocks or logging here."""

from .commands import (
    encode_auth, encode_cls, encode_dpub, encode_fin, encode_fins, encode_identify, encode_mpub, encode_mpub_framed, encode_nop,
    encode_pub, encode_rdy, encode_req, encode_sub, encode_touch, split_framed,
)
from .constants import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, MAGIC_V2
from .frames import NEED_DATA, Frame, FrameDecoder
from .message import Message, MessageData, decode_message
from .names import validate_channel, validate_topic

__all__ = [
    "MAGIC_V2", "HEARTBEAT", "FRAME_RESPONSE", "FRAME_ERROR", "FRAME_MESSAGE",
    "Frame", "FrameDecoder", "NEED_DATA", "Message", "MessageData", "decode_message",
    "validate_topic", "validate_channel",
    "encode_identify", "encode_auth", "encode_sub", "encode_pub", "encode_mpub", "encode_dpub",
    "encode_rdy", "encode_fin", "encode_fins", "encode_req", "encode_touch", "encode_cls", "encode_nop",
    "encode_mpub_framed", "split_framed",
]
