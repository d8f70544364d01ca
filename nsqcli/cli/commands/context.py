"""``nsqcli context``: named connection settings, like `nats context` (storage: nsqcli/contexts.py)."""

from __future__ import annotations

import json

import click

from ..command import Command, Group, option
from ..types import HOST_PORT, HTTP_ADDRESS


def _load(name: str) -> dict:
    """A context by name; an unknown or invalid name is a usage error (exit 2)."""
    from ... import contexts

    try:
        contexts.check_name(name)
        return contexts.load(name)
    except (ValueError, contexts.ContextError) as e:
        raise click.UsageError(str(e)) from None


def _sub(**kw):
    return click.command(cls=Command, uses_context=False, **kw)


class _Group(Group):
    """A context that cannot be read (wrong type, config dir is a file ...) is a usage error of
    every subcommand: one line, exit 2."""

    def invoke(self, ctx: click.Context):
        from ... import contexts

        try:
            return super().invoke(ctx)
        except contexts.ContextError as e:
            raise click.UsageError(str(e), ctx) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def context():
    """Named connection settings: save a cluster's addresses, TLS and auth once, then use it
    with --context NAME, NSQCLI_CONTEXT=NAME, or select it as the default.

    \b
    Flags and NSQCLI_* variables override what a context says. Contexts are TOML files in
    $NSQCLI_CONFIG_DIR, $XDG_CONFIG_HOME/nsqcli or ~/.config/nsqcli; secrets are stored only
    as a file reference (--auth-secret-file), never inline.

    \b
    Examples:
      nsqcli context add prod --lookupd-http-address lookupd-1:4161 --tls --auth-secret-file ~/.nsq-secret
      nsqcli context select prod
      nsqcli --context staging tail events
    """


@_sub(name="add", examples="""
nsqcli context add local --nsqd-tcp-address 127.0.0.1:4150 --nsqd-http-address 127.0.0.1:4151
nsqcli context add prod --lookupd-http-address 10.0.0.5:4161 --lookupd-http-address 10.0.0.6:4161 \\
    --tls --tls-ca-file ~/ca.pem --auth-secret-file ~/.nsq-secret --select
""")
@click.argument("name")
@option("--nsqd-tcp-address", "nsqd_tcp", multiple=True, type=HOST_PORT, help="nsqd TCP address (repeatable).")
@option("--nsqd-http-address", "nsqd_http", multiple=True, type=HTTP_ADDRESS,
        help="nsqd HTTP address (repeatable; stat, doctor, tail's backlog check).")
@option("--lookupd-http-address", "lookupd", multiple=True, type=HTTP_ADDRESS, help="nsqlookupd HTTP address (repeatable).")
@option("--tls", is_flag=True, help="Negotiate TLS.")
@option("--tls-ca-file", type=click.Path(exists=True, dir_okay=False, resolve_path=True))
@option("--tls-cert", type=click.Path(exists=True, dir_okay=False, resolve_path=True))
@option("--tls-key", type=click.Path(exists=True, dir_okay=False, resolve_path=True))
@option("--tls-min-version", type=click.Choice(["1.0", "1.1", "1.2", "1.3"]))
@option("--tls-insecure-skip-verify", is_flag=True)
@option("--snappy", is_flag=True)
@option("--deflate", is_flag=True)
@option("--deflate-level", type=click.IntRange(1, 9))
@option("--auth-secret-file", type=click.Path(exists=True, dir_okay=False, resolve_path=True),
        help="File holding the AUTH secret (the secret itself is never stored).")
@option("--client-id")
@option("--description", help="A note shown by 'context ls'.")
@option("--select", "select_it", is_flag=True, help="Also make it the default context.")
@option("--force", is_flag=True, help="Replace an existing context of that name.")
@click.pass_obj
def add(app, name, nsqd_tcp, nsqd_http, lookupd, select_it, force, **settings):
    """Save the connection settings NAME."""
    from ... import contexts

    try:
        contexts.check_name(name)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if name in contexts.names() and not force:
        raise click.UsageError(f"context {name!r} exists (use --force to replace it)")
    if bool(settings.get("tls_cert")) != bool(settings.get("tls_key")):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if settings.get("snappy") and settings.get("deflate"):
        raise click.UsageError("--snappy and --deflate cannot be used together")
    if not (nsqd_tcp or nsqd_http or lookupd):
        raise click.UsageError("give at least one --nsqd-tcp-address, --nsqd-http-address or --lookupd-http-address")
    data = {k.replace("_", "-"): v for k, v in settings.items()}
    data.update({"nsqd-tcp-address": list(nsqd_tcp), "nsqd-http-address": list(nsqd_http),
                 "lookupd-http-address": list(lookupd)})
    path = contexts.save(name, data)
    if select_it:
        contexts.select(name)
    app.info(f"saved context {name!r} in {path}" + (" and selected it" if select_it else
                                                     f"; use it with --context {name} or 'nsqcli context select {name}'"))
    return 0


@_sub(name="ls", examples="nsqcli context ls\nnsqcli context ls --json")
@option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def ls(as_json):
    """List the saved contexts; the selected one is marked with '*', one whose sandbox is gone
    with '(stale: ...)'."""
    from ... import contexts
    from ..app import write_stdout

    chosen = contexts.selected()
    rows = []
    for n in contexts.names():
        stale = None
        try:
            data = contexts.load(n)
            desc, stale = data.get("description", ""), contexts.stale(data)
        except contexts.ContextError as e:
            desc = f"(unreadable: {e})"
        rows.append({"name": n, "selected": n == chosen, "description": desc,
                     **({"stale": f"the sandbox that saved it is gone ({stale})"} if stale else {})})
    if as_json:
        write_stdout(json.dumps(rows) + "\n")
    elif rows:
        width = max(len(r["name"]) for r in rows)
        write_stdout("".join(f"{'*' if r['selected'] else ' '} {r['name']:<{width}}  {r['description']}"
                             f"{'  (stale: ' + r['stale'] + ')' if r.get('stale') else ''}".rstrip() + "\n"
                             for r in rows))
    else:
        click.echo("nsqcli: no contexts yet; create one with 'nsqcli context add NAME ...'", err=True)
    return 0


@_sub(name="show", examples="nsqcli context show prod\nnsqcli context show --json")
@click.argument("name", required=False)
@option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def show(name, as_json):
    """Show the settings of NAME (default: the selected context). Secrets are never shown: only
    the file that holds them."""
    from ... import contexts
    from ..app import write_stdout

    name = name or contexts.selected()
    if not name:
        raise click.UsageError("no context selected; name one ('nsqcli context ls' lists them)")
    data = _load(name)
    if as_json:
        write_stdout(json.dumps({"name": name, "selected": name == contexts.selected(), **data}, sort_keys=True) + "\n")
        return 0
    lines = [f"context {name}" + (" (selected)" if name == contexts.selected() else "")]
    for k in contexts.KEYS:
        if k in data:
            v = data[k]
            lines.append(f"  {k}: {' '.join(v) if isinstance(v, list) else v}")
    write_stdout("\n".join(lines) + "\n")
    return 0


@_sub(name="select", examples="nsqcli context select prod\nnsqcli context select --none")
@click.argument("name", required=False)
@option("--none", "unselect", is_flag=True, help="Select no context (flags and environment only).")
@click.pass_obj
def select(app, name, unselect):
    """Make NAME the default context of every command."""
    from ... import contexts

    if bool(name) == bool(unselect):
        raise click.UsageError("give a context NAME or --none")
    if name:
        _load(name)
    contexts.select(None if unselect else name)
    app.info(f"selected context {name!r}" if name else "no context selected")
    return 0


@_sub(name="rm", examples="nsqcli context rm old-cluster")
@click.argument("name")
@click.pass_obj
def rm(app, name):
    """Delete the context NAME."""
    from ... import contexts

    _load(name)
    contexts.remove(name)
    app.info(f"removed context {name!r}")
    return 0


for _c in (add, ls, show, select, rm):
    context.add_command(_c)
