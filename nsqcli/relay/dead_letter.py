"""Dead letters: a message that failed its last allowed attempt (``--max-attempts N``) is
published to a dead-letter topic (``--dead-letter-topic T``) as a JSON envelope, and FINed in
its source only after T's nsqd said OK. When that publish fails, the message is REQed (said):
nothing is lost, it comes back and is tried again.

The envelope (one JSON object, one line)::

    {"topic": ..., "channel": ..., "nsqd": ..., "id": ..., "attempts": N, "timestamp": ns,
     "error": "the last failure", "dead_lettered_at": "RFC 3339 UTC",
     "body": "utf-8 text"}          # or "body_base64": "..." when the body is not valid UTF-8

Redrive (the envelope carries ``body``/``body_base64`` as ``mpub --format json`` reads them)::

    nsqcli tail T -c redrive -n N --format raw > dead.ndjson
    nsqcli mpub -t TOPIC --format json dead.ndjson

Publishing runs on one thread of its own (:class:`DeadLetters`), so that an HTTP deliverer's
I/O thread or a handler thread never waits for the dead-letter nsqd.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time


def envelope(m, error: str) -> bytes:
    """The dead letter of message ``m`` (a consumer's Message) that failed with ``error``."""
    doc = {"topic": m.topic, "channel": m.channel, "nsqd": m.nsqd, "id": m.id.decode("ascii", "replace"),
           "attempts": m.attempts, "timestamp": m.timestamp, "error": error,
           "dead_lettered_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        doc["body"] = m.body.decode("utf-8")
    except UnicodeDecodeError:
        doc["body_base64"] = base64.b64encode(m.body).decode("ascii")
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class DeadLetters:
    """Publish dead letters to ``topic`` through ``producer`` (the source's nsqd cluster), on a
    thread of its own. ``submit(m, error, requeue_delay, on_done)``: FIN after nsqd's OK
    (``on_done(True)``), REQ after ``requeue_delay`` when the publish failed (``on_done(False)``).
    ``say(text)`` says each dead letter and each failure (a warning)."""

    def __init__(self, producer, topic: str, say, outages=None, publish_timeout: float = 10.0):
        self.producer, self.topic, self.say, self.outages = producer, topic, say, outages
        self.publish_timeout = publish_timeout
        self.sent = self.failed = 0
        self.lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition(self.lock)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="nsqcli-dead-letters", daemon=True)
        self._thread.start()

    def submit(self, m, error: str, requeue_delay: float, on_done=None) -> None:
        with self.lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._pending += 1
        if closed:  # stopping: back to nsqd at once, tried again next run
            m.requeue(delay=0, backoff=False)
            if on_done is not None:
                on_done(False)
            return
        self._queue.put((m, error, requeue_delay, on_done))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            m, error, delay, on_done = item
            ok = False
            try:
                ok = self._send(m, error, delay)
            finally:
                with self.lock:
                    self._pending -= 1
                    self._idle.notify_all()
                if on_done is not None:
                    try:
                        on_done(ok)
                    except Exception:  # a counter: never worth the thread
                        pass

    def _send(self, m, error: str, delay: float) -> bool:
        msg_id = m.id.decode("ascii", "replace")
        try:
            self.producer.publish(self.topic, envelope(m, error), timeout=self.publish_timeout)
        except Exception as e:
            with self.lock:
                self.failed += 1
            text = (f"cannot publish the dead letter of message {msg_id} to topic {self.topic}: {e}; "
                    f"the message is requeued (for {delay:g}s), NOT FINed")
            if self.outages is not None:
                self.outages.failed("dead-letter", text)
            else:
                self.say(text)
            try:
                m.requeue(delay=delay, backoff=False)
            except Exception:  # the connection is gone: nsqd redelivers it
                pass
            return False
        try:
            m.finish()
        except Exception:  # the connection is gone: nsqd redelivers it (a second dead letter)
            pass
        with self.lock:
            self.sent += 1
        if self.outages is not None:
            self.outages.ok("dead-letter", "dead-letter topic")
        self.say(f"message {msg_id} of {m.topic}/{m.channel} dead-lettered to topic {self.topic} after "
                 f"{m.attempts} attempt{'s' if m.attempts != 1 else ''}: {error}")
        return True

    def close(self, timeout: float = 10.0) -> None:
        """No more dead letters; wait (bounded) for the ones queued, REQ what is left, close."""
        end = time.monotonic() + timeout
        with self.lock:
            self._closed = True
            self._idle.wait_for(lambda: self._pending == 0, max(0.0, end - time.monotonic()))
        self._queue.put(None)
        self._thread.join(max(0.05, end - time.monotonic()))
        while True:  # not published by then: back to nsqd at once
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                try:
                    item[0].requeue(delay=0, backoff=False)
                except Exception:
                    pass
        self.producer.close(max(0.05, min(2.0, end - time.monotonic())))

