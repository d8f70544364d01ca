"""`nsqcli pub`'s work, click-free: read the message, publish it, say the outcome. The click
command (nsqcli.cli.commands.pub) and the fast path (nsqcli.entry) both call
:func:`publish_one` with what they parsed; outcomes are raised as nsqcli.exits maps them
(DeadlineExceeded: 3, NSQError: 1, UsageProblem: 2)."""

from __future__ import annotations

import sys
import time

from .clock import deadline_of
from .errors import NSQError, PublishError
from .exits import DeadlineExceeded, UsageProblem, write_stdout


def publish_one(voice, topic: str, message: str | None, *, cfg, resolve, timeout: float, timeout_given: bool,
                defer: float | None = None, fanout: bool = False, as_json: bool = False) -> int:
    """Publish ``message`` (all of stdin when it is None or '-') to ``topic``; 0 once nsqd said OK.

    ``voice``: info/warn/debug lines (nsqcli.exits.Voice); ``resolve(deadline)``: the nsqd
    addresses to publish to; ``timeout``: seconds, counted from process start - except that the
    default one (``timeout_given`` false) starts at the end of stdin, which it does not bound."""
    from .client.producer import Producer

    if message is None or message == "-":
        if sys.stdin.isatty() and message is None:
            voice.info("reading the message from stdin (Ctrl-D to end)")
        from .stdio import ReadTimeout, read_all

        try:
            body = read_all(sys.stdin.buffer, deadline_of(timeout) if timeout_given else None)
        except ReadTimeout as e:
            raise DeadlineExceeded(e.line) from None
        deadline = deadline_of(timeout) if timeout_given else time.monotonic() + timeout
    else:
        body = message.encode("utf-8", "surrogateescape")
        deadline = deadline_of(timeout)  # the whole command from process start: lookups, handshakes, failover
    if not body:
        raise UsageProblem("the message is empty (nsqd rejects empty messages)", "nsqcli pub")
    try:
        addresses = resolve(deadline)
    except NSQError as e:
        if _passed(deadline):
            raise DeadlineExceeded(f"--timeout passed: {e}") from e
        raise
    producer = Producer(addresses, cfg, fanout=fanout, deadline=deadline)
    producer.on_publish = note_interrupts
    try:
        acked = producer.publish(topic, body, defer=defer, timeout=timeout)
    except PublishError as e:
        if _passed(deadline):
            raise DeadlineExceeded(f"--timeout passed: {e}{size_note(len(body), e)}") from e
        if size_note(len(body), e):
            raise PublishError(f"{e}{size_note(len(body), e)}", e.published, e.failed, e.cause) from e
        raise
    finally:
        producer.close(timeout=max(0.1, deadline - time.monotonic()))
    if producer.maybe_held:
        voice.warn(resend_note(producer.maybe_held, acked))
    voice.debug(f"published {len(body)} bytes to {', '.join(acked)}")
    if as_json:
        import json

        write_stdout(json.dumps({"topic": topic, "bytes": len(body), "acknowledged_by": list(acked),
                                 "published": 1}) + "\n")
    return 0


def _passed(deadline: float) -> bool:
    """Exit 3 only when the deadline did pass (a handshake's own Timeout - its share of the
    deadline, with several nsqd - is a failure, 1); a wait that ended at it may wake a hair early."""
    return time.monotonic() >= deadline - 0.01


def note_interrupts(address: str, state: str) -> None:
    """Producer.on_publish: from now on SIGINT/SIGTERM exit as nsqcli.entry's early handler does
    (at once, 130 / 143, one line), the line saying the message may be published, not just
    "interrupted" (which reads as: nothing happened)."""
    import os
    import signal

    note = interrupt_note(address, state)

    def handler(signum, frame):
        try:
            os.write(2, f"nsqcli: interrupted ({signal.Signals(signum).name}){note}\n".encode())
        finally:
            os._exit(128 + signum)

    from .exits import STOP_SIGNALS

    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)


def interrupt_note(address: str, state: str) -> str:
    """What a command interrupted during a single publish adds to its "interrupted" line, for
    Producer.on_publish's ``state``: after the PUB was written the message may be in nsqd."""
    if state == "sent":
        return f": the message was sent to {address} and may have been published (no answer from nsqd yet)"
    return f": the message was published ({address} acknowledged it)"


def resend_note(maybe_held: list[str], acked: list[str]) -> str:
    """The warning after a publish was sent again (Producer.maybe_held): a possible duplicate."""
    return (f"the message was sent again to {', '.join(acked)} after the connection to {', '.join(maybe_held)} "
            "was lost before nsqd answered: it may be published there too (a possible duplicate)")


def size_note(size: int, error: BaseException) -> str:
    """What a failed single publish adds when its message is over nsqd's default --max-msg-size
    and nsqd did not say why: nsqd refuses such a message and closes at once, and its error
    frame can be lost to the reset while the message is still being written."""
    if size <= 1024 * 1024 or "E_BAD" in str(error):
        return ""
    return (f"; the message is {size} bytes, over nsqd's default --max-msg-size (1048576): nsqd may have "
            "refused it and closed the connection before its answer was read")
