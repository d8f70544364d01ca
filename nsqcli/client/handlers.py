"""A Consumer's handler modes: ``handler(message)`` per message (auto FIN on return, REQ with
backoff on exception, unless the handler responded or called
``message.disable_auto_response()``) or ``batch_handler(messages)`` per recv batch (commands
that write and sync a batch before FINing it). Batches run on the threads of a
:class:`~nsqcli.client.workers.HandlerPool` (the consumer's own, or one shared by many
consumers); this object is what the pool is fed with and calls back (:meth:`Handlers.handle`).

Everything that reaches nsqd goes through ``respond(link, command, n, kind)``
(nsqcli.client.responses), which writes the FIN/REQ and has the consumer settle it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..protocol import encode_fins
from .config import Config
from .workers import HandlerPool

log = logging.getLogger("nsqcli.client.consumer")


class Handlers:
    """The batches of one consumer on a handler pool; ``outstanding`` counts the batches
    (chunks) queued and not handled yet, under the consumer's ``lock``."""

    def __init__(self, handler: Callable | None, batch_handler: Callable | None, config: Config,
                 pool: HandlerPool | None, *, lock, respond: Callable, report: Callable,
                 on_give_up: Callable | None):
        self.handler = handler
        self.batch_handler = batch_handler
        self.config = config
        self.pool = pool if pool is not None else HandlerPool(config.concurrency)
        self.idle = threading.Condition(lock)  # notified when nothing is outstanding any more
        self.outstanding = 0
        self.given_up = 0
        self.on_give_up = on_give_up
        self._lock = lock
        self._respond = respond
        self._report = report
        self._used = False

    # -- the pool ------------------------------------------------------------------------------
    def start(self) -> None:
        self.pool.acquire()
        self._used = True

    def stop(self) -> None:
        if self._used:
            self._used = False
            self.pool.release()

    def split(self, msgs: list) -> list:
        """Per-message handlers: one recv batch split into up to ``concurrency`` chunks, so the
        handler threads share it (each chunk is FINed in one write). Batch handlers keep whole
        batches."""
        n = self.config.concurrency
        if self.handler is None or n <= 1 or len(msgs) <= 1:
            return [msgs]
        size = -(-len(msgs) // n)
        return [msgs[i:i + size] for i in range(0, len(msgs), size)]

    def arrived(self, chunks: list) -> None:
        """(under the lock) ``chunks`` will be handled."""
        self.outstanding += len(chunks)

    def dispatch(self, link, chunks: list) -> None:
        for chunk in chunks:
            self.pool.put((self, link, chunk))

    def wait_idle(self, deadline: float) -> None:
        """Until every batch queued so far was handled (or ``deadline``, time.monotonic())."""
        with self.idle:
            while self.outstanding and (left := deadline - time.monotonic()) > 0:
                self.idle.wait(left)

    # -- a handler thread ----------------------------------------------------------------------
    def handle(self, link, msgs: list) -> None:
        """(a handler thread) One batch of ``link`` (nsqcli.client.links.Link), then one batch
        fewer outstanding."""
        try:
            if self.batch_handler is not None:
                self._run_batch(link, msgs)
            else:
                self._run_each(link, msgs)
        except BaseException as e:  # never let a handler thread die silently
            self._report(e)
        finally:
            with self._lock:
                self.outstanding -= 1
                if not self.outstanding:
                    self.idle.notify_all()

    def _give_up(self, msg) -> None:
        self.given_up += 1
        if self.on_give_up is not None:
            self.on_give_up(msg)
        else:
            log.warning("giving up on message %s after %d attempts", msg.id.decode(errors="replace"),
                        msg.attempts)

    def _run_each(self, link, msgs: list) -> None:
        handler, max_attempts = self.handler, self.config.max_attempts
        fins = []
        for m in msgs:
            if max_attempts and m.attempts > max_attempts:
                self._give_up(m)
                if not m.responded:
                    m.responded = True
                    fins.append(m.id)
                continue
            try:
                handler(m)
            except Exception as e:
                self._report(e)
                if not m.responded and m.auto_response:
                    m.requeue()
                continue
            if not m.responded and m.auto_response:
                m.responded = True
                fins.append(m.id)
        if fins:
            self._respond(link, encode_fins(fins), len(fins), "fin")

    def _run_batch(self, link, msgs: list) -> None:
        max_attempts = self.config.max_attempts
        if max_attempts:
            keep = []
            for m in msgs:
                if m.attempts > max_attempts:
                    self._give_up(m)
                    if not m.responded:
                        m.finish()
                else:
                    keep.append(m)
            msgs = keep
        if not msgs:
            return
        try:
            self.batch_handler(msgs)
        except Exception as e:
            self._report(e)
            for m in msgs:
                if not m.responded and m.auto_response:
                    m.requeue()
            return
        ids = []
        for m in msgs:  # one recv batch = one connection: FIN them in one write
            if m.auto_response and not m.responded:
                m.responded = True
                ids.append(m.id)
        if ids:
            self._respond(link, encode_fins(ids), len(ids), "fin")
