"""Generate man pages (roff) and shell completion scripts from the click commands, so they can
never drift from --help. `scripts/gen-docs` writes them; tests/test_docs.py checks they are
up to date."""

from __future__ import annotations

import inspect

import click

from ..version import __version__

EXIT_STATUS = [("0", "success"), ("1", "runtime error (connection, protocol, auth, I/O)"),
               ("2", "usage error"), ("3", "a --timeout passed before the asked-for work was done")]


def _roff(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("-", "\\-")
    return "\n".join(("\\&" + line if line.startswith((".", "'")) else line) for line in text.splitlines())


def man_page(name: str, cmd: click.Command, parent: click.Context | None = None) -> str:
    ctx = click.Context(cmd, info_name=name, parent=parent, **cmd.context_settings)  # -h too, whatever ran first
    title = ctx.command_path.replace(" ", "-")
    help_text = inspect.cleandoc(cmd.help or "").replace("\b\n", "")
    help_text = "\n.PP\n".join(_roff(par) for par in help_text.split("\n\n"))
    out = [f'.TH {title.upper()} 1 "" "nsqcli {__version__}" "nsqcli manual"',
           ".SH NAME", f"{_roff(title)} \\- {_roff(cmd.get_short_help_str(80))}",
           ".SH SYNOPSIS", f".B {_roff(ctx.command_path)}", _roff(" ".join(cmd.collect_usage_pieces(ctx))),
           ".SH DESCRIPTION", help_text]
    from .command import SECTIONS

    opts = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
    opts.sort(key=lambda p: SECTIONS.index(getattr(p, "group", "Options")))
    heading = None
    for p in opts:
        rec = p.get_help_record(ctx)
        if rec is None:
            continue
        group = getattr(p, "group", "Options")
        if group != heading:
            heading = group
            out.append(".SH OPTIONS" if group == "Options" else f".SH {group.upper()} OPTIONS")
        out += [".TP", f".B {_roff(rec[0])}", _roff(rec[1] or "")]
    examples = getattr(cmd, "examples", "")
    if examples:
        out += [".SH EXAMPLES", ".nf", _roff(examples), ".fi"]
    if isinstance(cmd, click.Group):
        out.append(".SH COMMANDS")
        for sub in cmd.list_commands(ctx):
            c = cmd.get_command(ctx, sub)
            out += [".TP", f".B {sub}", _roff(c.get_short_help_str(100)) + f" See \\fBnsqcli\\-{sub}\\fR(1)."]
    out.append(".SH EXIT STATUS")
    for code, meaning in EXIT_STATUS:
        out += [".TP", f".B {code}", meaning]
    out += [".SH ENVIRONMENT", "Every connection flag has an NSQCLI_* variable, shown in \\fB\\-\\-help\\fR.",
            "NSQCLI_DEBUG=1 prints Python tracebacks.", ""]
    return "\n".join(out)


def man_pages() -> dict[str, str]:
    from . import cli

    root = click.Context(cli, info_name="nsqcli", **cli.context_settings)
    pages = {"nsqcli.1": man_page("nsqcli", cli)}
    for sub in cli.list_commands(root):
        pages[f"nsqcli-{sub}.1"] = man_page(sub, cli.get_command(root, sub), root)
    return pages


def completion(shell: str) -> str:
    """click's completion script for ``shell`` (bash, zsh, fish), generated in-process."""
    from click.shell_completion import get_completion_class

    from . import cli

    cls = get_completion_class(shell)
    return cls(cli, {}, "nsqcli", "_NSQCLI_COMPLETE").source()


COMPLETIONS = {"bash": "nsqcli.bash", "zsh": "_nsqcli", "fish": "nsqcli.fish"}
