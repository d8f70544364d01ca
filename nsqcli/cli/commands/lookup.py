"""``nsqcli lookup``: what every nsqlookupd knows, as one union."""

from __future__ import annotations

import json
import sys

import click

from ..command import command, option
from ..options import check_timeout, deadline_of, http_tls_options, setup_http_tls, timeout_option, topic_arguments
from ..types import HTTP_ADDRESS

DEFAULT_LOOKUPD = "127.0.0.1:4161"
#: how long each nsqlookupd is given (all are asked at once), unless --timeout leaves less
REQUEST_TIMEOUT = 5.0


def lookupd_option(f):
    return click.option("--lookupd-http-address", "lookupds", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_LOOKUPD_HTTP_ADDRESS",
                        show_envvar=True, help=f"nsqlookupd HTTP address (repeatable). Default {DEFAULT_LOOKUPD}.")(f)


@command(examples="""
nsqcli lookup                        # topics, their channels and producers
nsqcli lookup events                 # the nodes carrying 'events' (exit 1 if none does)
nsqcli lookup --nodes --json | jq '.nodes[].tcp_address'
""")
@topic_arguments(required=False, topic_help="Only this topic: its producers (what a consumer connects to) and "
                 "channels (or the first argument).")
@option("--nodes", is_flag=True, help="All nodes with their topics.")
@option("--json", "as_json", is_flag=True, help="One JSON line on stdout.")
@lookupd_option
@timeout_option("Give up (exit 3) if no nsqlookupd answered by then, counted from the start "
                "(each is asked for 5s at most).")
@http_tls_options
@click.pass_obj
def lookup(app, topic, nodes, as_json, lookupds, timeout, **tls):
    """Show topics, channels and producer nodes as the union of every nsqlookupd.

    Lookupds that fail are named in a warning; exit 0 when at least one answered, 1 when none did
    (3 when --timeout passed first). https:// addresses are verified with --tls-ca-file (else the
    system's CAs), --tls-cert and --tls-key.
    """
    import time

    from ...errors import NSQError
    from ..app import DeadlineExceeded, write_stdout
    from ...client.http import cluster_view

    if topic and nodes:
        raise click.UsageError("--topic and --nodes cannot be used together")
    check_timeout(timeout)
    setup_http_tls(tls)
    deadline = deadline_of(timeout)
    addresses = list(lookupds) or [DEFAULT_LOOKUPD]
    left = REQUEST_TIMEOUT if deadline is None else min(REQUEST_TIMEOUT, deadline - time.monotonic())
    if left <= 0:
        raise DeadlineExceeded("--timeout passed before any nsqlookupd was asked")
    view = cluster_view(addresses, topic, left)
    if not view.answered and deadline is not None and time.monotonic() >= deadline - 0.05 and left < REQUEST_TIMEOUT:
        raise DeadlineExceeded(f"--timeout passed before any nsqlookupd answered ({', '.join(addresses)})")
    if not view.answered:  # said once, as the error, with a port hint when one applies
        from ..footguns import no_answer

        raise NSQError(no_answer(f"no nsqlookupd answered ({', '.join(addresses)})", view.errors, "nsqlookupd"))
    for e in view.errors:
        app.warn(f"nsqlookupd failed: {e}")
    doc = _document(view, topic, nodes)
    if topic and not view.producers(topic) and not view.topics.get(topic):
        raise NSQError(f"topic {topic!r} is unknown to nsqlookupd {', '.join(view.answered)}")
    if as_json:
        write_stdout(json.dumps(doc, sort_keys=True) + "\n")
    elif sys.stdout.isatty():
        _rich(app, doc, topic, nodes)
    else:
        write_stdout(_plain(doc, topic, nodes))
    return 0


def _document(view, topic, nodes) -> dict:
    doc = {"lookupds": {"answered": view.answered,
                        "failed": [{"endpoint": e.endpoint, "error": str(e)} for e in view.errors]}}
    if nodes:
        doc["nodes"] = [n.to_json() for _, n in sorted(view.nodes.items())]
        return doc
    topics = [topic] if topic else sorted(view.topics)
    doc["topics"] = [{
        "topic": t, "channels": sorted(view.topics.get(t, ())),
        "producers": [{**_short(n), "tombstoned": n.topics[t]} for n in sorted(view.producers(t), key=lambda n: n.tcp_address)],
    } for t in topics]
    return doc


def _short(n) -> dict:
    return {"tcp_address": n.tcp_address, "http_address": n.http_address, "hostname": n.hostname,
            "version": n.version}


def _rows(doc, topic, nodes) -> tuple[list[str], list[list[str]]]:
    if nodes:
        head = ["NODE (TCP)", "HTTP", "HOSTNAME", "VERSION", "TOPICS"]
        rows = [[n["tcp_address"], n["http_address"], n["hostname"], n["version"],
                 " ".join(t["topic"] + (" (tombstoned)" if t["tombstoned"] else "") for t in n["topics"]) or "-"]
                for n in doc["nodes"]]
        return head, rows
    if topic:
        head = ["PRODUCER (TCP)", "HTTP", "HOSTNAME", "VERSION", "TOMBSTONED"]
        t = doc["topics"][0]
        rows = [[p["tcp_address"], p["http_address"], p["hostname"], p["version"], "yes" if p["tombstoned"] else "no"]
                for p in t["producers"]]
        return head, rows
    head = ["TOPIC", "CHANNELS", "PRODUCERS"]
    rows = [[t["topic"], " ".join(t["channels"]) or "-",
             " ".join(p["tcp_address"] + ("(tombstoned)" if p["tombstoned"] else "") for p in t["producers"]) or "-"]
            for t in doc["topics"]]
    return head, rows


def _plain(doc, topic, nodes) -> str:
    head, rows = _rows(doc, topic, nodes)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    if topic:
        lines.append(f"channels: {' '.join(doc['topics'][0]['channels']) or '-'}")
    return "\n".join(lines) + "\n"


def _rich(app, doc, topic, nodes) -> None:
    from rich.console import Console
    from rich.table import Table

    head, rows = _rows(doc, topic, nodes)
    table = Table(*head, title=f"topic {topic}" if topic else ("nodes" if nodes else "topics"))
    for r in rows:
        table.add_row(*r)
    out = Console(highlight=False, markup=False, emoji=False)
    out.print(table)
    if topic:
        out.print(f"channels: {' '.join(doc['topics'][0]['channels']) or '-'}")
