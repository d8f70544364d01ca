"""Command lines that click would accept but that do not mean what the user meant, refused
before the command runs (one usage line, exit 2):

- a Go-style single-dash long flag: ``-topic x`` is click's ``-t opic`` plus a stray ``x``;
- a single-valued option given twice with different values (``pub -t a -t b``): click keeps
  the last one silently.

Cheap on purpose (``nsqcli pub`` runs it): a walk over argv, no imports beyond click.
"""

from __future__ import annotations

import re

import click


def _takes_value(p: click.Parameter) -> bool:
    return isinstance(p, click.Option) and not p.is_flag and not p.count


def _option_table(command: click.Command, ctx: click.Context) -> dict[str, click.Option]:
    table: dict[str, click.Option] = {}
    for p in command.get_params(ctx):
        if isinstance(p, click.Option):
            for name in (*p.opts, *p.secondary_opts):
                table[name] = p
    return table


def refuse(command: click.Command, ctx: click.Context, args: list[str]) -> None:
    """Raise click.UsageError for a single-dash long flag or a repeated single-valued option."""
    try:
        _walk(_option_table(command, ctx), args)
    except click.UsageError as e:
        e.ctx = ctx  # "see 'nsqcli tail --help'"
        raise


def _walk(table: dict, args: list[str]) -> None:
    seen: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            return
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            p = table.get(name)
            if p is None or not _takes_value(p):
                continue
            if not eq:
                if i >= len(args):
                    return  # click says the value is missing
                value, i = args[i], i + 1
            _once(p, name, value, seen)
        elif arg.startswith("-") and len(arg) > 1:
            _single_dash_long(arg, table)
            i = _cluster(arg, args, i, table, seen)


def _single_dash_long(arg: str, table: dict) -> None:
    """``-topic`` (or ``-topic=x``) where ``--topic`` is an option of this command."""
    word = arg[1:].partition("=")[0]
    if len(word) > 1 and f"--{word}" in table and f"-{word}" not in table:
        raise click.UsageError(f"'{arg}' is not an option: use --{word}{arg[1 + len(word):]} "
                               "(two dashes; one dash is for one-letter options)")


def _cluster(arg: str, args: list[str], i: int, table: dict, seen: dict) -> int:
    """Walk ``-vq`` / ``-tNAME`` / ``-t NAME``; returns the index of the next argument."""
    for pos in range(1, len(arg)):
        name = "-" + arg[pos]
        p = table.get(name)
        if p is None:
            return i  # not ours to judge (a negative number, or click's "no such option")
        if _takes_value(p):
            value = arg[pos + 1:]
            if not value:
                if i >= len(args):
                    return i
                value, i = args[i], i + 1
            _once(p, name, value, seen)
            return i
    return i


def _once(p: click.Option, name: str, value: str, seen: dict) -> None:
    if p.multiple or p.nargs != 1:
        return
    before = seen.get(p.name)
    if before is not None and before[1] != value:
        shown = max(p.opts, key=len)
        raise click.UsageError(f"{shown} given twice ({before[0]} {before[1]!r}, then {name} {value!r}): "
                               "give it once")
    seen[p.name] = (name, value)


#: what an HTTP request to a port that is not the right server's HTTP port looks like
_TCP_SIGNS = ("reset by peer", "not an HTTP answer", "E_BAD_PROTOCOL", "Broken pipe")
_HTTP_PORT = {"nsqd": 4151, "nsqlookupd": 4161}


def port_hint(error, server: str) -> str:
    """The hint for an HTTP failure that says the address is another port: a TCP port (nsqd's
    4150, nsqlookupd's 4160), or the other server's HTTP port (a 404 to its paths). '' if none.
    ``server`` is what was meant: "nsqd" or "nsqlookupd". (pub, tail and doctor give the same.)"""
    text = str(error)
    port = _HTTP_PORT[server]
    if any(sign in text for sign in _TCP_SIGNS):
        return f"this port speaks TCP, not HTTP: give {server}'s HTTP port, usually {port}"
    if "HTTP 404" in text and not re.search(r"404 (TOPIC|CHANNEL)_NOT_FOUND", text):
        # an unknown path is the other server; TOPIC_/CHANNEL_NOT_FOUND is the right one saying no
        other = "an nsqd" if server == "nsqlookupd" else "nsqlookupd"
        return f"it answered 404 like {other} HTTP port: give {server}'s HTTP port, usually {port}"
    return ""


def with_hint(text: str, errors, server: str) -> str:
    """``text`` plus the first port hint any of ``errors`` gives."""
    for e in errors:
        hint = port_hint(e, server)
        if hint:
            return f"{text} ({hint})"
    return text


def no_answer(text: str, errors, server: str) -> str:
    """``text`` ("no nsqlookupd answered (ADDRESSES)") with the port hint when one applies, else
    with what each server did: one line either way."""
    hinted = with_hint(text, errors, server)
    return hinted if hinted != text else f"{text}: {'; '.join(map(str, errors))}"
