"""Consumers and writers run in their own process by bench/run.py and bench/nsqd_profile.py, each
draining or publishing N messages and printing '<count> <seconds>'.
Usage: python -m bench.workers nsqcli|nsqcli-each|raw|pynsq|raw-writer|framing-writer|producer ADDRESS TOPIC N
[WINDOW: batches in flight, raw-writer and framing-writer]"""

from __future__ import annotations

import sys
import time


def v2_socket(address: str):
    """A TCP connection to nsqd that has sent the protocol magic (TCP_NODELAY: no batching)."""
    import socket

    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"  V2")
    return s


def nsqcli_consumer(address: str, topic: str, n: int, per_message: bool = False) -> tuple[int, float]:
    import threading

    from nsqcli import Config, Consumer

    done = threading.Event()
    count = [0]
    t0 = [0.0]

    def batch(msgs):  # FIN only (auto-response after return); one hand-off per recv batch
        if not count[0]:
            t0[0] = time.perf_counter()
        count[0] += len(msgs)
        if count[0] >= n:
            done.set()

    def each(msg):  # FIN only (auto-response after return), one call per message
        count[0] += 1
        if count[0] >= n:
            done.set()

    handlers = {"handler": each} if per_message else {"batch_handler": batch}
    c = Consumer(topic, "bench", nsqd_tcp_addresses=[address],
                 config=Config(max_in_flight=2500, max_attempts=0), **handlers)
    start = time.perf_counter()
    c.start()
    done.wait(600)
    elapsed = time.perf_counter() - start
    c.stop()
    return count[0], elapsed


def raw_reader(address: str, topic: str, n: int) -> tuple[int, float]:
    """A reference, not a client: the least a CPython reader can do - one thread, no message
    objects, no handler, no flow control: recv, find each message id, one FIN write per recv
    (as bench_reader, it asks for RDY 2500; like our consumer, for 64 KiB output buffers)."""
    import json
    import socket
    import struct

    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    ident = json.dumps({"client_id": "raw", "hostname": "raw", "output_buffer_size": 65536}).encode()
    s.sendall(b"  V2IDENTIFY\n" + struct.pack(">l", len(ident)) + ident
              + f"SUB {topic} bench\nRDY 2500\n".encode())
    header = struct.Struct(">lL").unpack_from
    buf, got, start = b"", -2, time.perf_counter()  # -2: the OKs to IDENTIFY and SUB
    while got < n:
        data = s.recv(262144)
        if not data:
            break
        buf += data
        off, size_all, ids = 0, len(buf), []
        while size_all - off >= 8:
            size, ftype = header(buf, off)
            end = off + 4 + size
            if end > size_all:
                break
            if ftype == 2:
                ids.append(buf[off + 18:off + 34])
            elif ftype == 1:
                raise SystemExit(f"raw reader: nsqd said {buf[off + 8:end]!r}")
            elif buf[off + 8:end] == b"_heartbeat_":
                s.sendall(b"NOP\n")
            else:
                got += 1  # an OK
            off = end
        buf = buf[off:]
        if ids:
            got += len(ids)
            s.sendall(b"FIN " + b"\nFIN ".join(ids) + b"\n")
    elapsed = time.perf_counter() - start
    s.close()
    return got, elapsed


def producer(address: str, topic: str, n: int, size: int = 100) -> tuple[int, float]:
    """nsqcli's Producer: ``multi_publish`` of N x ``size`` B in MPUBs of 200 (its default
    window, 16 in flight), 100,000 bodies per call; timed after the connection is made."""
    from nsqcli import Producer

    body = b"x" * size
    with Producer(address) as p:
        p.publish(topic, body)
        t0 = time.perf_counter()
        left = n
        while left:
            k = min(left, 100_000)
            p.multi_publish(topic, [body] * k, batch_size=200)
            left -= k
        return n, time.perf_counter() - t0


def framing_writer(address: str, topic: str, n: int, batch: int = 200, window: int = 16) -> tuple[int, float]:
    """A reference: the raw writer's one-thread socket loop (no I/O thread, futures or ledger)
    around the Producer's own per-message work - each list of 100,000 bodies measured once
    (``measure``), cut into batches of ``batch``, each framed with ``encode_mpub_checked``.
    What it reaches is what framing the bodies costs, whatever the threading."""
    from nsqcli.client.producer import measure
    from nsqcli.protocol.commands import encode_mpub_checked
    from nsqcli.protocol.frames import FrameDecoder

    s = v2_socket(address)
    decoder, body, left = FrameDecoder(), b"x" * 100, n
    start = time.perf_counter()
    while left:
        k = min(left, 100_000)
        bodies = [body] * k
        lens = measure(bodies, 1 << 20)
        batches = [(bodies[i:i + batch], lens[i:i + batch]) for i in range(0, k, batch)]
        sent = acked = 0
        while acked < len(batches):
            while sent < len(batches) and sent - acked < window:
                b, sizes = batches[sent]
                s.sendall(encode_mpub_checked(topic, b, 4 + 4 * len(b) + sum(sizes), sizes))
                sent += 1
            data = s.recv(65536)
            if not data:
                raise SystemExit("framing writer: nsqd closed the connection")
            decoder.receive_data(data)
            for frame in decoder.decode_all():
                if frame.data == b"_heartbeat_":  # every 30 s: answered, not an OK
                    s.sendall(b"NOP\n")
                elif frame.data != b"OK":
                    raise SystemExit(f"framing writer: nsqd said {frame!r}")
                else:
                    acked += 1
        left -= k
    elapsed = time.perf_counter() - start
    s.close()
    return n, elapsed


def raw_writer(address: str, topic: str, n: int, batch: int = 200, window: int = 256) -> tuple[int, float]:
    """A reference, not a client: the least a CPython publisher can do - one thread, one
    connection, the same MPUB of ``batch`` x 100 B built once and sent ``n / batch`` times,
    ``window`` batches in flight, each OK counted (no framing, ledger, futures or threads).
    What it reaches is about what one connection to this nsqd takes on this machine (16 in
    flight did as well or better than 256 in bench.nsqd_profile; ~15% less in an earlier run)."""
    import struct

    s = v2_socket(address)
    pack = struct.Struct(">L").pack
    payload = pack(batch) + b"".join(pack(100) + b"x" * 100 for _ in range(batch))
    mpub = b"MPUB %s\n" % topic.encode() + pack(len(payload)) + payload
    ok = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    batches, sent, acked, buf = n // batch, 0, 0, b""
    start = time.perf_counter()
    while acked < batches:
        while sent < batches and sent - acked < window:
            s.sendall(mpub)
            sent += 1
        data = s.recv(65536)
        if not data:
            raise SystemExit("raw writer: nsqd closed the connection")
        buf += data
        k = len(buf) // len(ok)
        if buf[:k * len(ok)] != ok * k:
            raise SystemExit(f"raw writer: nsqd said {buf[:200]!r}")
        acked, buf = acked + k, buf[k * len(ok):]
    elapsed = time.perf_counter() - start
    s.close()
    return acked * batch, elapsed


def pynsq_consumer(address: str, topic: str, n: int) -> tuple[int, float]:
    import nsq
    import tornado.ioloop

    count = [0]
    start = time.perf_counter()
    end = [0.0]

    def handler(message):
        count[0] += 1
        if count[0] >= n and not end[0]:
            end[0] = time.perf_counter()
            tornado.ioloop.IOLoop.current().add_callback(tornado.ioloop.IOLoop.current().stop)
        return True

    nsq.Reader(topic=topic, channel="bench", message_handler=handler, nsqd_tcp_addresses=[address],
               max_in_flight=2500)
    nsq.run()
    return count[0], end[0] - start


def pynsq_writer(address: str, topic: str, path: str, batch: int = 500, window: int = 8) -> tuple[int, float]:
    """pynsq's Writer publishing the newline-separated records of ``path`` with MPUB batches
    (same batch size as nsqcli mpub, up to ``window`` batches in flight)."""
    import nsq
    import tornado.ioloop

    start = time.perf_counter()
    with open(path, "rb") as f:
        records = [r for r in f.read().split(b"\n") if r]
    batches = [records[i:i + batch] for i in range(0, len(records), batch)]
    loop = tornado.ioloop.IOLoop.current()
    state = {"next": 0, "inflight": 0, "done": 0, "error": None}
    writer = nsq.Writer([address])

    def pump():
        while state["inflight"] < window and state["next"] < len(batches):
            b = batches[state["next"]]
            state["next"] += 1
            state["inflight"] += 1
            writer.mpub(topic, b, callback=lambda conn, data, n=len(b): finished(n, data))
        if state["done"] == len(records) or state["error"]:
            loop.stop()

    def finished(n, data):
        state["inflight"] -= 1
        if isinstance(data, Exception):
            state["error"] = data
        else:
            state["done"] += n
        pump()

    def begin():
        if not writer.conns:
            loop.call_later(0.01, begin)
            return
        pump()

    loop.call_later(0.01, begin)
    nsq.run()
    if state["error"]:
        raise SystemExit(f"pynsq Writer failed: {state['error']}")
    return state["done"], time.perf_counter() - start


if __name__ == "__main__":
    kind, address, topic, arg = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    window = {"window": int(sys.argv[5])} if len(sys.argv) > 5 else {}  # batches in flight (writers)
    if kind == "pynsq-writer":
        got, secs = pynsq_writer(address, topic, arg)
    elif kind == "raw-writer":
        got, secs = raw_writer(address, topic, int(arg), **window)
    elif kind == "framing-writer":
        got, secs = framing_writer(address, topic, int(arg), **window)
    elif kind == "producer":
        got, secs = producer(address, topic, int(arg))
    else:
        if kind.startswith("nsqcli"):
            got, secs = nsqcli_consumer(address, topic, int(arg), per_message=kind == "nsqcli-each")
        elif kind == "raw":
            got, secs = raw_reader(address, topic, int(arg))
        else:
            got, secs = pynsq_consumer(address, topic, int(arg))
    print(got, secs, flush=True)
