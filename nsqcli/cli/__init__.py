"""The click layer: the root command (.root), one module per command (.commands), and the
click-free pieces a command's run shares with a handed-off process (.app, .signals, .handoff,
.archiving).

Importing this package imports no click: a process ``to-file`` handed off to (nsqcli.cli.handoff)
runs .archiving without it. ``from nsqcli.cli import cli, main, COMMANDS`` loads .root on use."""

from __future__ import annotations


#: what .root defines that ``nsqcli.cli.X`` names (a submodule is imported as usual)
_ROOT = {"cli", "main", "COMMANDS", "LazyGroup", "CONTEXT", "help_command", "Command", "Group", "did_you_mean"}
__all__ = sorted(_ROOT)


def __getattr__(name: str):
    if name not in _ROOT:
        raise AttributeError(f"module 'nsqcli.cli' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.root"), name)
