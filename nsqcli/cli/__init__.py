"""The ``nsqcli`` root command. Subcommands are imported only when invoked (start-up time)."""

from __future__ import annotations

import importlib

import click

from .. import __version__

#: subcommand name -> "module:function"; a module per command.
COMMANDS = {
    "sandbox": "nsqcli.cli.sandbox_cmd:sandbox",
    "pub": "nsqcli.cli.pub:pub",
    "mpub": "nsqcli.cli.mpub:mpub",
    "tail": "nsqcli.cli.tail:tail",
    "lookup": "nsqcli.cli.lookup_cmd:lookup",
    "stat": "nsqcli.cli.stat:stat",
    "to-file": "nsqcli.cli.to_file:to_file",
    "replay": "nsqcli.cli.replay:replay",
    "query": "nsqcli.cli.query:query",
    "to-parquet": "nsqcli.cli.to_parquet:to_parquet",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="nsqcli")
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-vv: debug, with tracebacks).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """nsqcli - the NSQ command-line suite.

    \b
    Exit codes: 0 ok, 1 runtime error (connection, protocol, auth, I/O),
                2 usage error, 3 deadline passed before the work was done.
    Set NSQCLI_DEBUG=1 to see Python tracebacks.
    """
    from .app import App

    ctx.obj = App(verbosity=-1 if quiet else verbose)


def main() -> None:
    from .app import run

    run(cli)
