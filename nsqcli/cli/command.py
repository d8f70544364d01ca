"""The click classes every nsqcli command is built with.

- Options carry a help *section* (``group``): a command's own options come first, then the
  shared ones under headings (Connection, TLS, Auth, ...), so the ~20 shared options do not
  bury what the command is about.
- An ``Examples:`` section (the ``examples`` argument), also used by the man pages.
- ``-v/--verbose`` and ``-q/--quiet`` are accepted after the subcommand too (``nsqcli tail -t x -q``).
"""

from __future__ import annotations

import click

#: help sections in display order; options without a group belong to the command itself
SECTIONS = ("Options", "Monitoring", "Connection", "TLS", "Compression", "Auth", "Destination", "HTTP", "Spark",
            "Global")


class Option(click.Option):
    def __init__(self, *args, group: str = "Options", **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group

    def get_error_hint(self, ctx: click.Context) -> str:
        """'--flag' only (click adds the env var even when the value came from the flag)."""
        return " / ".join(f"'{o}'" for o in self.opts)


def option(*decls, group: str = "Options", **kwargs):
    """click.option with a help section."""
    return click.option(*decls, cls=Option, group=group, **kwargs)


def _set_verbosity(ctx: click.Context, param: click.Parameter, value):
    app = ctx.obj
    if app is None or not value:
        return value
    if param.name == "quiet":
        app.verbosity = -1
    else:
        app.verbosity = max(app.verbosity, value)
    return value


def _apply_context(ctx: click.Context, param: click.Parameter, value):
    """Eager: the context's settings become this command's defaults before the other options
    are read (so flags and NSQCLI_* variables still win)."""
    from .. import contexts

    from click.core import ParameterSource

    if ctx.get_parameter_source("context") != ParameterSource.COMMANDLINE and getattr(ctx.obj, "context", None):
        value = ctx.obj.context  # `nsqcli --context X cmd` beats NSQCLI_CONTEXT
    if ctx.resilient_parsing:
        return value
    try:
        name, settings = contexts.active(value)
    except contexts.ContextError as e:
        raise click.BadParameter(str(e), ctx, param) from None
    if name:
        ctx.default_map = {**contexts.defaults_for(ctx.command, settings), **(ctx.default_map or {})}
        if ctx.obj is not None:
            ctx.obj.context = name
    return value


def context_option() -> Option:
    return Option(["--context"], metavar="NAME", envvar="NSQCLI_CONTEXT", show_envvar=True,
                  expose_value=False, is_eager=True, group="Global", callback=_apply_context,
                  help="Use this saved context's connection settings (see 'nsqcli context'); "
                       "'none' for no context.")


class Command(click.Command):
    """A subcommand with grouped option help, an Examples section and the global -v/-q."""

    def __init__(self, *args, examples: str | None = None, uses_context: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.examples = (examples or "").strip("\n")
        self.params.append(Option(["-v", "--verbose"], count=True, expose_value=False, group="Global",
                                  callback=_set_verbosity, is_eager=True,
                                  help="More output on stderr (-vv: debug, with tracebacks)."))
        self.params.append(Option(["-q", "--quiet"], is_flag=True, expose_value=False, group="Global",
                                  callback=_set_verbosity, is_eager=True, help="Only errors on stderr."))
        if uses_context:
            self.params.append(context_option())

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from .footguns import refuse  # `-topic x` (Go style), `-t a -t b`: refused, not guessed

        if not ctx.resilient_parsing:
            refuse(self, ctx, args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            _add_hint(e, habit_hint(self.name, e, ctx.params))
            raise

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            _add_hint(e, habit_hint(self.name, e, ctx.params))
            raise

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list] = {}
        for p in self.get_params(ctx):
            if not isinstance(p, click.Option):
                continue
            rec = p.get_help_record(ctx)
            if rec is not None:
                sections.setdefault(getattr(p, "group", "Options"), []).append(rec)
        for name in sorted(sections, key=lambda s: SECTIONS.index(s) if s in SECTIONS else 0):
            title = name if name == "Options" else f"{name} options"
            with formatter.section(title):
                formatter.write_dl(sections[name])

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.examples:
            with formatter.section("Examples"):
                for line in self.examples.splitlines():
                    formatter.write(" " * formatter.current_indent + line + "\n" if line else "\n")
        super().format_epilog(ctx, formatter)


def did_you_mean(name: str, names) -> str | None:
    """The known name closest to a mistyped one (``tial`` -> ``tail``), or None."""
    import difflib

    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return close[0] if close else None


#: habits from other tools that meet another meaning here: (command or "*", option) -> hint
OPTION_HABITS = {
    ("tail", "--json"): "for one JSON object a message use -f json",
    ("*", "--follow"): "nsqcli tail follows until stopped; -n N stops after N messages",
    ("tail", "-F"): "nsqcli tail follows until stopped; -n N stops after N messages",
}
#: commands people type from other tools -> what to run here
COMMAND_HABITS = {name: "to read messages: nsqcli tail TOPIC (a shell command per message: nsqcli exec)"
                  for name in ("sub", "subscribe", "consume", "cat", "read", "follow")}
COMMAND_HABITS.update({name: "to publish: nsqcli pub TOPIC MESSAGE (many: nsqcli mpub)"
                       for name in ("publish", "produce", "send", "put")})


def habit_hint(command: str | None, error: click.UsageError, params: dict) -> str | None:
    """A hint for an error that a habit from another tool explains (`tail -f events`: -f is
    --format here; `tail --json`), or None."""
    option = getattr(error, "option_name", None)
    if isinstance(error, click.NoSuchOption) and option:
        return OPTION_HABITS.get((command, option)) or OPTION_HABITS.get(("*", option))
    fmt = params.get("fmt")
    if (command == "tail" and "missing TOPIC" in error.format_message() and isinstance(fmt, str)
            and fmt not in ("raw", "json") and "{" not in fmt):
        return (f"-f is --format here, so {fmt!r} was read as the format; tail follows by default: "
                f"nsqcli tail {fmt}")
    return None


def _add_hint(error: click.UsageError, hint: str | None) -> None:
    if hint and hint not in error.message:
        error.message = f"{error.message.rstrip('.')}; {hint}"
        if isinstance(error, click.NoSuchOption):
            error.possibilities = []  # the hint replaces click's "Did you mean"


class Group(click.Group):
    """A command group whose unknown subcommand gets one line with a suggestion:
    ``No such command 'tial'. Did you mean 'tail'?`` (exit 2)."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as e:
            # click suggests from self.commands, which a lazy group has not loaded
            name = getattr(e, "command_name", None)
            if name is not None and name in COMMAND_HABITS:
                e.message = f"No such command {name!r}: {COMMAND_HABITS[name]}"
            elif name is not None and not getattr(e, "possibilities", None):
                hint = did_you_mean(name, self.list_commands(ctx))
                if hint:
                    e.message = f"No such command {name!r}. Did you mean {hint!r}?"
            raise


def command(name: str | None = None, **kwargs):
    """click.command with nsqcli's Command class."""
    return click.command(name, cls=Command, **kwargs)
