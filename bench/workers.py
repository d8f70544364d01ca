"""Consumers run in their own process by bench/run.py, each draining N messages and printing
'<count> <seconds>'. Usage: python -m bench.workers nsqcli|pynsq ADDRESS TOPIC N"""

from __future__ import annotations

import sys
import time


def nsqcli_consumer(address: str, topic: str, n: int) -> tuple[int, float]:
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

    c = Consumer(topic, "bench", batch_handler=batch, nsqd_tcp_addresses=[address],
                 config=Config(max_in_flight=2500, max_attempts=0))
    start = time.perf_counter()
    c.start()
    done.wait(600)
    elapsed = time.perf_counter() - start
    c.stop()
    return count[0], elapsed


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


if __name__ == "__main__":
    kind, address, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    fn = nsqcli_consumer if kind == "nsqcli" else pynsq_consumer
    got, secs = fn(address, topic, n)
    print(got, secs, flush=True)
