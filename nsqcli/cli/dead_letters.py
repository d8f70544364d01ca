"""Dead letters on the CLI (exec, to-http, to-nsq): the options, their checks, and the
DeadLetters (nsqcli.relay.dead_letter) publishing on the source's nsqd cluster."""

from __future__ import annotations

import click

from .command import option
from .options import build_config
from .types import TOPIC


def dead_letter_options(f):
    """--dead-letter-topic (exec, to-http, to-nsq; each has its own --max-attempts help)."""
    f = option("--dead-letter-topic", type=TOPIC, metavar="TOPIC",
               help="After the last attempt (--max-attempts), publish the message to TOPIC (on the source's "
                    "nsqd) as a JSON envelope {topic, channel, nsqd, id, attempts, timestamp, error, body or "
                    "body_base64}; FINed only after that nsqd said OK (else requeued, said). Redrive: "
                    "'nsqcli tail TOPIC -c redrive -n N -f raw > dead.ndjson; nsqcli mpub -t ORIGINAL -f json "
                    "dead.ndjson'.")(f)
    return f


def open_dead_letters(app, conn: dict, source_topic: str, topic: str, deadline: float | None, outages=None,
                      cancel=None):
    """DeadLetters (nsqcli.relay.dead_letter) publishing to ``topic`` on the source's cluster: the
    given nsqd, else the nsqd nsqlookupd says carry ``source_topic``. Within ``deadline``;
    ``cancel``: resolve_producers'."""
    from ..client.producer import Producer
    from ..relay.dead_letter import DeadLetters
    from .options import resolve_producers

    addresses = resolve_producers(app, conn, source_topic, deadline, cancel)
    return DeadLetters(Producer(addresses, build_config(conn)), topic, app.warn, outages)


def check_dead_letter(max_attempts: int, dead_letter_topic: str | None, source_topics) -> None:
    if dead_letter_topic and not max_attempts:
        raise click.UsageError("--dead-letter-topic needs --max-attempts N (the attempt after which a message "
                               "is dead-lettered)")
    if dead_letter_topic and dead_letter_topic in source_topics:
        raise click.UsageError(f"--dead-letter-topic {dead_letter_topic} is the topic being consumed")
