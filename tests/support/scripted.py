"""A socket-free nsqd for the publish path: every dial gets a :class:`ScriptedConn` (a
MemoryStream that parses what the Connection writes and answers it), and one shared *plan*
says what happens to each publish command, in the order they reach the server:

    "ok"           publish it, answer OK
    "fail"         answer E_MPUB_FAILED (E_PUB_FAILED for PUB) and close: not published
    "drop_before"  close without publishing or answering (the client cannot know: UNKNOWN)
    "drop_after"   publish it, then close without answering (UNKNOWN, and it IS published)
    "stall"        never answer, never publish (the client's timeout decides)
    "trickle"      publish it, answer OK one byte at a time

After the plan, everything is "ok". Like nsqd, a batch over ``max_body_size`` gets E_BAD_BODY,
a message over ``max_msg_size`` E_BAD_MESSAGE, both fatal: the connection closes and nothing
after the refused command is read. ``held`` is what the server published, in order: the
test's ground truth, as nsqd's /stats is for a real server.
"""

from __future__ import annotations

import struct
import threading

from tests.support.fakes import FRAME_ERROR, FRAME_RESPONSE, MemoryStream, frame

_U32 = struct.Struct(">I")


class ScriptedNsqd:
    def __init__(self, plan=(), max_body_size: int = 5 * 1024 * 1024, max_msg_size: int = 1024 * 1024):
        self.plan = list(plan)
        self.max_body_size = max_body_size
        self.max_msg_size = max_msg_size
        self.held: list[bytes] = []
        self.published_without_answer: list[bytes] = []  # drop_after: held, never acknowledged
        self.actions: list[str] = []                     # what each publish command met
        self.conns: list[ScriptedConn] = []
        self.lock = threading.Lock()

    def dial(self, address: str, timeout: float) -> "ScriptedConn":
        conn = ScriptedConn(self, address)
        self.conns.append(conn)
        return conn

    def next_action(self) -> str:
        with self.lock:
            action = self.plan.pop(0) if self.plan else "ok"
            self.actions.append(action)
            return action

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class ScriptedConn(MemoryStream):
    def __init__(self, server: ScriptedNsqd, address: str):
        super().__init__(address)
        self.server = server
        self.buf = bytearray()
        self.magic = False
        self.dead = False  # the server side closed: everything later is ignored

    def _received(self, data: bytes) -> None:
        super()._received(data)
        if self.dead:
            return
        self.buf += data
        while not self.dead and self._one():
            pass

    # -- parsing -----------------------------------------------------------------------------
    def _one(self) -> bool:
        """Handle one complete command from the buffer; False when more bytes are needed."""
        buf = self.buf
        if not self.magic:
            if len(buf) < 4:
                return False
            del buf[:4]
            self.magic = True
            return True
        nl = buf.find(b"\n")
        if nl < 0:
            return False
        line = bytes(buf[:nl])
        name = line.split(b" ", 1)[0]
        if name in (b"IDENTIFY", b"PUB", b"MPUB", b"DPUB"):
            if len(buf) < nl + 5:
                return False
            size = _U32.unpack_from(buf, nl + 1)[0]
            if name == b"MPUB" and size > self.server.max_body_size:
                del buf[:nl + 5]  # nsqd does not read the body: it answers and closes
                return self._fatal(b"E_BAD_BODY MPUB body too big %d > %d" % (size, self.server.max_body_size))
            if len(buf) < nl + 5 + size:
                return False
            body = bytes(buf[nl + 5:nl + 5 + size])
            del buf[:nl + 5 + size]
            return self._payload(name, body)
        del buf[:nl + 1]
        if name == b"CLS":
            self.feed(frame(FRAME_RESPONSE, b"CLOSE_WAIT"))
        return True  # NOP, RDY, FIN...: no answer

    def _payload(self, name: bytes, body: bytes) -> bool:
        if name == b"IDENTIFY":
            self.feed(frame(FRAME_RESPONSE, b"OK"))
            return True
        bodies = [body] if name != b"MPUB" else _split_mpub(body)
        if any(len(b) > self.server.max_msg_size for b in bodies):
            return self._fatal(b"E_BAD_MESSAGE %s message too big" % name)
        return self._publish(name, bodies)

    def _publish(self, name: bytes, bodies: list[bytes]) -> bool:
        server = self.server
        action = server.next_action()
        if action == "fail":
            return self._fatal(b"E_MPUB_FAILED MPUB failed" if name == b"MPUB" else b"E_PUB_FAILED PUB failed")
        if action == "drop_before":
            return self._die()
        if action == "stall":
            self.dead = True
            return False
        with server.lock:
            server.held += bodies
            if action == "drop_after":
                server.published_without_answer += bodies
        if action == "drop_after":
            return self._die()
        ok = frame(FRAME_RESPONSE, b"OK")
        if action == "trickle":
            for i in range(len(ok)):
                self.feed(ok[i:i + 1])
        else:
            self.feed(ok)
        return True

    def shutdown_write(self) -> None:
        """The client half-closed: like nsqd, read the EOF and close our side."""
        if not self.closed:
            self.feed(None)

    def _fatal(self, error: bytes) -> bool:
        self.feed(frame(FRAME_ERROR, error))
        return self._die()

    def _die(self) -> bool:
        self.dead = True
        self.feed(None)  # EOF after what was said
        return False


def _split_mpub(body: bytes) -> list[bytes]:
    count = _U32.unpack_from(body, 0)[0]
    out, pos = [], 4
    for _ in range(count):
        n = _U32.unpack_from(body, pos)[0]
        out.append(body[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out
