"""The ``nsqcli`` root command. Subcommands are imported only when invoked (start-up time).
The console script enters through nsqcli.entry (early signals, the `pub` fast path, a hand-off)."""

from __future__ import annotations

import importlib

import click

from ..version import __version__
from .command import Command, Group, did_you_mean  # click only

#: subcommand name -> "module:function"; a module per command.
COMMANDS = {
    "sandbox": "nsqcli.cli.commands.sandbox:sandbox",
    "pub": "nsqcli.cli.commands.pub:pub",
    "mpub": "nsqcli.cli.commands.mpub:mpub",
    "tail": "nsqcli.cli.commands.tail:tail",
    "lookup": "nsqcli.cli.commands.lookup:lookup",
    "stat": "nsqcli.cli.commands.stat:stat",
    "to-file": "nsqcli.cli.commands.to_file:to_file",
    "to-nsq": "nsqcli.cli.commands.to_nsq:to_nsq",
    "to-http": "nsqcli.cli.commands.to_http:to_http",
    "exec": "nsqcli.cli.commands.exec:exec_command",
    "replay": "nsqcli.cli.commands.replay:replay",
    "query": "nsqcli.cli.commands.query:query",
    "to-parquet": "nsqcli.cli.commands.to_parquet:to_parquet",
    "context": "nsqcli.cli.commands.context:context",
    "topic": "nsqcli.cli.commands.admin:topic",
    "channel": "nsqcli.cli.commands.admin:channel",
    "node": "nsqcli.cli.commands.admin:node",
    "bench": "nsqcli.cli.commands.bench:bench",
    "doctor": "nsqcli.cli.commands.doctor:doctor",
    "wait": "nsqcli.cli.commands.wait:wait",
    "check": "nsqcli.cli.commands.check:check",
    "version": "nsqcli.cli.commands.meta:version",
    "completion": "nsqcli.cli.commands.meta:completion",
    "man": "nsqcli.cli.commands.meta:man",
    "help": "nsqcli.cli.root:help_command",
}


class LazyGroup(Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(cls=LazyGroup, context_settings=CONTEXT, invoke_without_command=True)
@click.version_option(__version__, "-V", "--version", prog_name="nsqcli")
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-vv: debug, with tracebacks).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr.")
@click.option("--context", metavar="NAME", help="Use this saved context (also NSQCLI_CONTEXT; see 'nsqcli context').")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool, context: str | None) -> None:
    """nsqcli - the NSQ command-line suite.

    \b
    Start here:
      nsqcli sandbox --save-context dev     a local NSQ, saved as context "dev"
      nsqcli pub events 'hello'             publish (exit 0 only after nsqd's OK)
      nsqcli tail events                    watch a topic without taking from its consumers
      nsqcli doctor                         check the cluster and your settings
      nsqcli COMMAND --help                 options and examples of a command

    \b
    Exit codes: 0 ok, 1 runtime error (connection, protocol, auth, I/O),
                2 usage error, 3 deadline passed before the work was done.
    Set NSQCLI_DEBUG=1 to see Python tracebacks.
    """
    from .app import App

    ctx.obj = App(verbosity=-1 if quiet else verbose)
    ctx.obj.context = context
    from .envvars import warn_unknown

    warn_unknown(ctx.obj.warn)  # a mistyped variable is said, not silently ignored
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@click.command("help", cls=Command, uses_context=False, examples="""
nsqcli help                    # the same as nsqcli --help
nsqcli help tail               # the same as nsqcli tail --help
nsqcli help topic create       # nested commands too
""")
@click.argument("names", nargs=-1, metavar="[COMMAND]...")
@click.pass_context
def help_command(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Show the help of COMMAND (exactly what 'nsqcli COMMAND --help' shows)."""
    from .app import write_stdout

    root = ctx.find_root()
    here = click.Context(root.command, info_name=root.info_name, **root.command.context_settings)
    for name in names:
        group = here.command
        sub = group.get_command(here, name) if isinstance(group, click.Group) else None
        if sub is None:
            hint = did_you_mean(name, group.list_commands(here)) if isinstance(group, click.Group) else None
            raise click.UsageError(f"No such command {name!r}"
                                   f"{'. Did you mean ' + repr(hint) + '?' if hint else ''}", here)
        here = click.Context(sub, info_name=name, parent=here, **sub.context_settings)
    write_stdout(here.get_help() + "\n")


def main() -> None:
    from .app import run

    run(cli)
