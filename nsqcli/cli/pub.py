"""``nsqcli pub``: publish one message and exit 0 only when nsqd said OK."""

from __future__ import annotations

import sys

import click

from .options import build_config, connection_options, nsqd_addresses, pop_connection
from .types import DURATION, TOPIC


def resolve_producers(app, conn: dict, topic: str, deadline: float | None = None) -> list[str]:
    """nsqd addresses to publish to: the explicit ones, else the nodes that lookupd says carry
    the topic (the official to_nsq cannot do this)."""
    addrs = nsqd_addresses(conn)
    lookupds = list(conn.get("lookupd_http_addresses") or ())
    if addrs or not lookupds:
        return addrs
    from ..errors import NSQError
    from ..client.http import lookup_all

    import time

    timeout = 5.0 if deadline is None else max(0.001, min(5.0, deadline - time.monotonic()))
    producers, errors = lookup_all(lookupds, topic, timeout)
    for e in errors:
        app.warn(str(e))
    if not producers:
        if errors and len(errors) == len(lookupds):
            raise NSQError(f"no nsqlookupd answered ({'; '.join(map(str, errors))})")
        raise NSQError(f"no nsqd carries topic {topic!r} according to nsqlookupd; "
                       "give --nsqd-tcp-address to create it")
    return [p.tcp_address for p in producers]


@click.command()
@click.option("-t", "--topic", required=True, type=TOPIC, help="Topic to publish to.")
@click.argument("message", required=False)
@click.option("--defer", type=DURATION, help="Deliver after this delay (DPUB).")
@click.option("--fanout", is_flag=True, help="Publish to every nsqd given (like to_nsq), not just one.")
@click.option("--timeout", type=DURATION, default="10s", show_default=True,
              help="Give up (exit 3) if nsqd has not answered by then.")
@connection_options()
@click.pass_obj
def pub(app, topic, message, defer, fanout, timeout, **kwargs):
    """Publish MESSAGE (or all of stdin, binary-safe, when MESSAGE is '-' or absent) to TOPIC.

    Exits 0 only after nsqd answered OK. With several --nsqd-tcp-address it fails over to the
    next one; with --lookupd-http-address alone it publishes to a node that carries the topic.
    """
    import time

    from ..errors import NSQError, PublishError, Timeout
    from ..client.producer import Producer
    from .app import DeadlineExceeded

    conn = pop_connection(kwargs)
    cfg = build_config(conn)
    if message is None or message == "-":
        if sys.stdin.isatty() and message is None:
            app.info("reading the message from stdin (Ctrl-D to end)")
        body = sys.stdin.buffer.read()
    else:
        body = message.encode("utf-8", "surrogateescape")
    if not body:
        raise click.UsageError("the message is empty (nsqd rejects empty messages)")
    if len(body) > cfg.max_msg_size:
        app.warn(f"message is {len(body)} bytes; nsqd's default --max-msg-size is {cfg.max_msg_size}")
    deadline = time.monotonic() + timeout  # for the whole command: lookups, handshakes, failover
    try:
        addresses = resolve_producers(app, conn, topic, deadline)
    except NSQError as e:
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"--timeout passed: {e}") from e
        raise
    producer = Producer(addresses, cfg, fanout=fanout, deadline=deadline)
    try:
        acked = producer.publish(topic, body, defer=defer, timeout=max(0.001, deadline - time.monotonic()))
    except PublishError as e:
        if isinstance(e.cause, Timeout) or time.monotonic() >= deadline:
            raise DeadlineExceeded(str(e)) from e
        raise
    finally:
        producer.close(timeout=max(0.1, deadline - time.monotonic()))
    app.debug(f"published {len(body)} bytes to {', '.join(acked)}")
    return 0
