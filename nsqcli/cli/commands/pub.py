"""``nsqcli pub``: publish one message and exit 0 only when nsqd said OK."""

from __future__ import annotations

import click

from ...defaults import PUB_TIMEOUT
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
@option("--timeout", type=DURATION, default=PUB_TIMEOUT, show_default=True,
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
    from click.core import ParameterSource

    from ...publish import publish_one

    if timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'--timeout'")
    conn = pop_connection(kwargs)
    cfg = build_config(conn)
    # a --timeout given bounds reading stdin too; the default one starts at its end
    given = click.get_current_context().get_parameter_source("timeout") != ParameterSource.DEFAULT
    return publish_one(app, topic, rest[0] if rest else None, cfg=cfg, timeout=timeout, timeout_given=given,
                       resolve=lambda deadline: resolve_producers(app, conn, topic, deadline), defer=defer,
                       fanout=fanout, as_json=as_json)
