"""``nsqcli pub``: publish one message and exit 0 only when nsqd said OK."""

from __future__ import annotations

import json
import sys

import click

from ..command import command, option
from ..options import build_config, connection_options, pop_connection, resolve_producers, topic_arguments
from ..types import DURATION


@command(examples="""
nsqcli pub events 'hello'                     # TOPIC and MESSAGE as arguments
nsqcli pub -t events 'hello'                  # the same with -t
some-producer | nsqcli pub events             # all of stdin as ONE binary-safe message
nsqcli pub events --defer 30s 'later'         # DPUB: delivered in 30 s
nsqcli pub events 'x' --json                  # {"acknowledged_by": [...], "bytes": 1, ...} on stdout
nsqcli pub events 'x' --lookupd-http-address 127.0.0.1:4161   # to a node that carries the topic
""")
@topic_arguments(topic_help="Topic to publish to (or the first argument).", rest="message", rest_metavar="[MESSAGE]",
                 rest_max=1)
@option("--defer", type=DURATION, help="Deliver after this delay (DPUB).")
@option("--fanout", is_flag=True, help="Publish to every nsqd given (like to_nsq), not just one.")
@option("--timeout", type=DURATION, default="10s", show_default=True,
        help="Give up (exit 3) if nsqd has not answered by then, counted from process start; a --timeout given "
             "also bounds reading stdin, the default starts at its end (0 is refused).")
@option("--json", "as_json", is_flag=True, help="The result as one JSON line on stdout.")
@connection_options()
@click.pass_obj
def pub(app, topic, rest, defer, fanout, timeout, as_json, **kwargs):
    """Publish MESSAGE (or all of stdin, binary-safe, when MESSAGE is '-' or absent) to TOPIC.

    Exits 0 only after nsqd answered OK. With several --nsqd-tcp-address it fails over to the
    next one; with --lookupd-http-address alone it publishes to a node that carries the topic.
    """
    import time

    from ...errors import NSQError, PublishError
    from ...client.producer import Producer
    from ..app import DeadlineExceeded
    from ..options import deadline_of

    message = rest[0] if rest else None
    if timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--timeout'")
    conn = pop_connection(kwargs)
    cfg = build_config(conn)
    if message is None or message == "-":
        if sys.stdin.isatty() and message is None:
            app.info("reading the message from stdin (Ctrl-D to end)")
        from click.core import ParameterSource

        from ...stdio import ReadTimeout, read_all

        # a --timeout given bounds the read too; the default one starts at the end of input
        given = click.get_current_context().get_parameter_source("timeout") != ParameterSource.DEFAULT
        try:
            body = read_all(sys.stdin.buffer, deadline_of(timeout) if given else None)
        except ReadTimeout as e:
            raise DeadlineExceeded(e.line) from None
        deadline = deadline_of(timeout) if given else time.monotonic() + timeout
    else:
        body = message.encode("utf-8", "surrogateescape")
        deadline = deadline_of(timeout)  # the whole command from process start: lookups, handshakes, failover
    if not body:
        raise click.UsageError("the message is empty (nsqd rejects empty messages)")
    try:
        addresses = resolve_producers(app, conn, topic, deadline)
    except NSQError as e:
        if _passed(deadline):
            raise DeadlineExceeded(f"--timeout passed: {e}") from e
        raise
    producer = Producer(addresses, cfg, fanout=fanout, deadline=deadline)
    producer.on_publish = _note_interrupts
    try:
        acked = producer.publish(topic, body, defer=defer, timeout=timeout)
    except PublishError as e:
        from ...client.producer import size_note

        if _passed(deadline):
            raise DeadlineExceeded(f"--timeout passed: {e}{size_note(len(body), e)}") from e
        if size_note(len(body), e):
            raise PublishError(f"{e}{size_note(len(body), e)}", e.published, e.failed, e.cause) from e
        raise
    finally:
        producer.close(timeout=max(0.1, deadline - time.monotonic()))
    if producer.maybe_held:
        from ...client.producer import resend_note

        app.warn(resend_note(producer.maybe_held, acked))
    app.debug(f"published {len(body)} bytes to {', '.join(acked)}")
    if as_json:
        from ..app import write_stdout

        write_stdout(json.dumps({"topic": topic, "bytes": len(body), "acknowledged_by": list(acked),
                                 "published": 1}) + "\n")
    return 0


def _passed(deadline: float) -> bool:
    """Exit 3 only when the deadline did pass (a handshake's own Timeout - its share of the
    deadline, with several nsqd - is a failure, 1); a wait that ended at it may wake a hair early."""
    import time

    return time.monotonic() >= deadline - 0.01


def _note_interrupts(address: str, state: str) -> None:
    """Producer.on_publish: from now on SIGINT/SIGTERM exit as nsqcli.entry's early handler does
    (at once, 130 / 143, one line), the line saying the message may be published - as on the
    fast path (nsqcli.entry._pub_progress), which prints the same."""
    import os
    import signal

    from ...client.producer import interrupt_note

    note = interrupt_note(address, state)

    def handler(signum, frame):
        try:
            os.write(2, f"nsqcli: interrupted ({signal.Signals(signum).name}){note}\n".encode())
        finally:
            os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)

