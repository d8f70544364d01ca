"""Wire constants of the NSQ V2 protocol."""

#: Sent once after connecting, selects protocol V2.
MAGIC_V2 = b"  V2"

#: Frame types: [4-byte size][4-byte type][data]; size counts type + data.
FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

#: Response bodies with a meaning of their own.
HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

#: Message header: 8-byte timestamp (ns), 2-byte attempts (unsigned), 16-byte hex id.
MESSAGE_HEADER_SIZE = 26
MESSAGE_ID_SIZE = 16

#: nsqd defaults (nsqd/options.go), used where a server has not told us better.
DEFAULT_MAX_MSG_SIZE = 1024 * 1024
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024
DEFAULT_MAX_RDY_COUNT = 2500

#: Frames larger than this are refused before allocating (a real nsqd never sends a frame
#: much larger than --max-msg-size; anything bigger is garbage or a non-NSQ port).
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
