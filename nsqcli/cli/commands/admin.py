"""``nsqcli topic ...``, ``nsqcli channel ...``, ``nsqcli node tombstone``: nsqadmin's buttons
from the command line (the HTTP calls are planned and made by nsqcli/client/admin.py)."""

from __future__ import annotations

import json
import sys

import click

from ..command import Command, Group, option
from ..options import (check_timeout, deadline_of, http_tls_options, setup_http_tls, timeout_option,
                       topic_arguments)
from ..types import HTTP_ADDRESS

WHAT = {"create": "create", "delete": "delete (with every message in it)", "pause": "pause",
        "unpause": "unpause", "empty": "empty (drop every message in it)", "tombstone": "tombstone"}


def _targets(f):
    for o in reversed([
        option("--nsqd-http-address", "nsqd", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS",
               show_envvar=True, group="Connection", help="Act on these nsqd (repeatable) instead of asking nsqlookupd."),
        option("--lookupd-http-address", "lookupd", multiple=True, type=HTTP_ADDRESS,
               envvar="NSQCLI_LOOKUPD_HTTP_ADDRESS", show_envvar=True, group="Connection",
               help="Find the nsqd that carry the topic here (and create/delete/tombstone in nsqlookupd too)."),
        option("--dry-run", is_flag=True, help="List what would change; change nothing."),
        option("-y", "--yes", is_flag=True, help="Do not ask before destroying (needed when stdin is not a terminal)."),
        option("--json", "as_json", is_flag=True, help="Per-node results as JSON on stdout."),
        timeout_option("Give up (exit 3) if not done on every node by then, counted from the start (each "
                       "request is given 5s at most; the results so far are printed)."),
        http_tls_options,
    ]):
        f = o(f)
    return f


#: the most each HTTP request is given (nodes are asked at once), unless --timeout leaves less
REQUEST_TIMEOUT = 5.0


class NotConfirmed(click.ClickException):
    """The user answered no: nothing was done, exit 1 (not an interrupt's 130)."""

    exit_code = 1


def run_action(app, action: str, topic: str, channel: str | None, nsqd, lookupd, dry_run: bool, yes: bool,
               as_json: bool, node: str | None = None, timeout: float | None = None, tls: dict | None = None) -> int:
    from ...client.admin import DESTRUCTIVE, apply
    from ..app import DeadlineExceeded

    check_timeout(timeout)
    setup_http_tls(tls or {})
    deadline = deadline_of(timeout)
    nsqd, lookupd = list(nsqd), list(lookupd)
    if not nsqd and not lookupd:
        nsqd = ["127.0.0.1:4151"]
    steps = _plan(app, action, topic, channel, nsqd, lookupd, node, deadline)
    name = f"{'channel' if channel else 'topic'} {topic}{'/' + channel if channel else ''}"
    if dry_run:
        _print_plan(action, steps, as_json)
        return 0
    if action in DESTRUCTIVE and not yes:
        _confirm(action, name, steps)
    if _left(deadline) <= 0:  # the confirmation took the time: nothing was done
        raise DeadlineExceeded(f"--timeout passed before {action} started: nothing was changed")
    apply(steps, REQUEST_TIMEOUT, deadline)
    _print_results(action, topic, channel, steps, as_json)
    _refuse_unfinished(action, name, topic, channel, steps, lookupd, deadline)
    app.info(f"{name}: {action} done on {len(steps)} node(s)")
    return 0


def _left(deadline: float | None) -> float:
    """What one request is given: REQUEST_TIMEOUT, cut to what is left of --timeout."""
    import time

    if deadline is None:
        return REQUEST_TIMEOUT
    return min(REQUEST_TIMEOUT, deadline - time.monotonic())


def _passed(deadline: float | None) -> bool:
    import time

    return deadline is not None and time.monotonic() >= deadline - 0.05


def _plan(app, action: str, topic: str, channel, nsqd: list, lookupd: list, node, deadline) -> list:
    """The steps (one HTTP call per node), its warnings said; a bad name is a usage error."""
    from ...client.admin import plan
    from ...errors import LookupdError, NSQError
    from ..app import DeadlineExceeded
    from ..footguns import with_hint

    if _left(deadline) <= 0:
        raise DeadlineExceeded(f"--timeout passed before {action} started: nothing was changed")
    try:
        steps, warnings = plan(action, topic, channel, nsqd, lookupd, node, timeout=_left(deadline))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except LookupdError as e:  # e.g. an nsqd port given as --lookupd-http-address
        if _passed(deadline):
            raise DeadlineExceeded(f"--timeout passed before nsqlookupd answered: nothing was changed ({e})") from None
        raise NSQError(with_hint(str(e), [e], "nsqlookupd")) from None
    for w in warnings:
        app.warn(w)
    return steps


def _print_plan(action: str, steps: list, as_json: bool) -> None:
    """--dry-run: what would change."""
    from ..app import write_stdout

    if as_json:
        write_stdout(json.dumps({"action": action, "dry_run": True, "steps": [s.to_json() for s in steps]}) + "\n")
    else:
        write_stdout("".join(f"would {s.describe()}\n" for s in steps))


def _confirm(action: str, name: str, steps: list) -> None:
    """A destructive action without --yes: asked on a terminal, refused elsewhere."""
    if not sys.stdin.isatty():
        raise click.UsageError(f"{action} is destructive: add --yes to {WHAT[action]} {name} "
                               f"on {len(steps)} node(s) (--dry-run lists them)")
    for s in steps:
        click.echo(f"  {s.describe()}", err=True)
    if not click.confirm(f"{WHAT[action].capitalize()} {name} as above?", err=True):
        raise NotConfirmed(f"not confirmed: {name} was not changed")


def _print_results(action: str, topic: str, channel, steps: list, as_json: bool) -> None:
    """Every step's result on stdout (JSON, or one line each)."""
    from ..app import write_stdout

    if as_json:
        write_stdout(json.dumps({"action": action, "topic": topic, "channel": channel,
                                 "steps": [s.to_json() for s in steps]}) + "\n")
    else:
        write_stdout("".join(f"{'SKIP' if s.skipped else 'ok  ' if s.ok else 'FAIL'} {s.describe()}"
                             f"{'  ' + s.error if s.error else ''}\n" for s in steps))


def _refuse_unfinished(action: str, name: str, topic: str, channel, steps: list, lookupd: list, deadline) -> None:
    """Exit 3 when --timeout passed before every node was done, 1 when a node failed (how to finish)."""
    from ...errors import NSQError
    from ..app import DeadlineExceeded
    from ..footguns import with_hint

    failed = [s for s in steps if s.ok is False]
    ran = [s for s in steps if not s.skipped]
    if _passed(deadline) and (failed or len(ran) < len(steps)):
        done = sum(bool(s.ok) for s in steps)
        text = f"--timeout passed before {action} was done on every node ({done} of {len(steps)} done)"
        if action == "delete" and len(ran) < len(steps):
            text += "; " + _how_to_finish(name, topic, channel, [s.address for s in failed] or ["?"], lookupd)
        raise DeadlineExceeded(text)
    if failed:
        server = "nsqlookupd" if failed[0].kind == "nsqlookupd" else "nsqd"
        text = with_hint(f"{action} failed on {len(failed)} of {len(ran)} node(s): {failed[0].error}",
                         [failed[0].error], server)
        if len(ran) < len(steps):
            text += "; " + _how_to_finish(name, topic, channel, [s.address for s in failed], lookupd)
        if action == "create" and channel and "TOPIC_NOT_FOUND" in str(failed[0].error):
            lk = [s.address for s in steps if s.kind == "nsqlookupd" and s.ok]
            text += (f"; topic {topic} does not exist on that nsqd yet: create it first (nsqcli topic create "
                     f"{topic}), then run this again"
                     + (f" (nsqlookupd {', '.join(lk)} already lists the channel)" if lk else ""))
        raise NSQError(text)


def _how_to_finish(name: str, topic: str, channel: str | None, failed: list[str], lookupd: list[str]) -> str:
    """After a delete that failed on some nsqd (nsqlookupd left as it was): how to finish it."""
    nodes = ", ".join(failed)
    text = (f"{name} was left in nsqlookupd, so consumers still find it on {nodes}: to finish, run this "
            f"again once {'that node answers' if len(failed) == 1 else 'those nodes answer'}")
    if channel:
        return text
    lk = " ".join(f"--lookupd-http-address {a}" for a in lookupd)
    return (text + f" (if {'it is' if len(failed) == 1 else 'they are'} gone for good: nsqcli node tombstone "
            f"{topic} {failed[0]} {lk} --yes{', for each' if len(failed) > 1 else ''})")


def _group(name: str, doc: str) -> click.Group:
    return Group(name, help=doc, context_settings={"help_option_names": ["-h", "--help"]})


topic = _group("topic", """Create, delete, pause, unpause or empty a topic on every nsqd that carries
it (found through nsqlookupd, like nsqadmin) or on the nsqd given.

\b
Examples:
  nsqcli topic create events --lookupd-http-address 127.0.0.1:4161
  nsqcli topic pause events                        # consumers get nothing until unpause
  nsqcli topic delete events --dry-run             # what would be deleted where
  nsqcli topic delete events --yes --json""")
channel = _group("channel", """Create, delete, pause, unpause or empty a channel of a topic on every
nsqd that carries the topic (found through nsqlookupd) or on the nsqd given.

\b
Examples:
  nsqcli channel create events archive
  nsqcli channel empty events archive --yes
  nsqcli channel pause events billing --lookupd-http-address 127.0.0.1:4161""")
node = _group("node", """Node operations in nsqlookupd.

\b
Examples:
  nsqcli node tombstone events 10.0.0.7:4151 --lookupd-http-address 10.0.0.5:4161 --yes""")


def _topic_command(action: str, doc: str):
    @click.command(action, cls=Command, uses_context=True, help=doc,
                   examples=f"nsqcli topic {action} events{' --yes' if action in ('delete', 'empty') else ''}")
    @topic_arguments()
    @_targets
    @click.pass_obj
    def cmd(app, topic, nsqd, lookupd, dry_run, yes, as_json, timeout, **tls):
        return run_action(app, action, topic, None, nsqd, lookupd, dry_run, yes, as_json, timeout=timeout, tls=tls)

    return cmd


def _channel_command(action: str, doc: str):
    @click.command(action, cls=Command, uses_context=True, help=doc,
                   examples=f"nsqcli channel {action} events archive{' --yes' if action in ('delete', 'empty') else ''}")
    @topic_arguments(channel=True, channel_required=True)
    @_targets
    @click.pass_obj
    def cmd(app, topic, channel, nsqd, lookupd, dry_run, yes, as_json, timeout, **tls):
        return run_action(app, action, topic, channel, nsqd, lookupd, dry_run, yes, as_json, timeout=timeout,
                          tls=tls)

    return cmd


DOCS = {
    "create": "Create {x} (through nsqlookupd: registered there too, so consumers find it at once).",
    "delete": "Delete {x} and its messages: on the nsqd nodes first, then in every nsqlookupd. If it "
              "fails on any nsqd, nsqlookupd is left as it was (no node keeps messages no consumer finds) "
              "and the command says how to finish.",
    "pause": "Pause {x}: messages stay queued, nothing is delivered.",
    "unpause": "Unpause {x}.",
    "empty": "Drop every queued message of {x} (in memory and on disk).",
}
for _action, _doc in DOCS.items():
    topic.add_command(_topic_command(_action, _doc.format(x="TOPIC")))
    channel.add_command(_channel_command(_action, _doc.format(x="CHANNEL of TOPIC")))


@click.command("tombstone", cls=Command, uses_context=True, examples="""
nsqcli node tombstone events 10.0.0.7:4151 --lookupd-http-address 10.0.0.5:4161 --yes
nsqcli node tombstone events 10.0.0.7:4150 --dry-run     # a node's TCP or HTTP address
""")
@topic_arguments(rest="node", rest_metavar="NODE", rest_min=1, rest_max=1)
@_targets
@click.pass_obj
def tombstone(app, topic, rest, nsqd, lookupd, dry_run, yes, as_json, timeout, **tls):
    """Tombstone TOPIC's producer NODE in every nsqlookupd: consumers stop being sent to that node
    for the topic (e.g. before deleting the topic there, or decommissioning the node)."""
    if not lookupd:
        raise click.UsageError("tombstoning is done in nsqlookupd: give --lookupd-http-address")
    return run_action(app, "tombstone", topic, None, (), lookupd, dry_run, yes, as_json, node=rest[0],
                      timeout=timeout, tls=tls)


node.add_command(tombstone)
