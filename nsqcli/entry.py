"""The ``nsqcli`` console script and ``python -m nsqcli``: early signals, the `pub` fast path,
else the click app (nsqcli.cli).

Why this module is outside cli/: the click commands import click, and click alone (inspect,
typing, uuid, datetime, gettext ...) costs ~35 ms on a slow machine, most of the 40 ms `nsqcli
pub` may take from exec to exit in a shell loop. So a plain publish, `nsqcli pub [-t] TOPIC
[MESSAGE]` with the few options scripts use, is parsed here without click; anything this parser
does not fully understand - another option, --help, a bad value, a context that may apply,
another NSQCLI_* variable, `-` options before `pub` - goes to click untouched, before anything
was read or sent. Only the argv scanner is the fast path's own: the publish (nsqcli.publish),
the exit path (nsqcli.exits), the defaults and the NSQCLI_* variables (nsqcli.defaults)
are the click command's, all click-free. tests/cli/test_pub_fast_path.py
runs one argv matrix through both paths and compares stdout, stderr and exit code, and checks
that the scanner accepts nothing click parses differently. NSQCLI_NO_FAST_PATH=1 turns it off.
"""

from __future__ import annotations

import os
import signal
import sys

from .clock import STARTED  # noqa: F401 - first: `--timeout` counts from process start (nsqcli.clock)


def _early_exit(signum, frame):
    try:
        os.write(2, f"nsqcli: interrupted ({signal.Signals(signum).name})\n".encode())
    finally:
        os._exit(128 + signum)


def install_early_signals(argv: list[str]) -> None:
    """SIGINT/SIGTERM/SIGHUP exit at once with the documented code (130 / 143 / 129) and one
    line, instead of a KeyboardInterrupt traceback or a bare death by signal, until a command
    installs its own handling (a clean stop, nsqcli.cli.app). A signal a parent made us ignore
    (``nohup``) stays ignored; the signals are unblocked in case a parent blocked them across exec.

    Except SIGHUP for `to-file`, which means "close and move the files", never "stop": it is
    held blocked until the archive's own handler is in place (nsqcli.cli.archiving), as across
    a hand-off's exec. (It was left to its default, so a logrotate's `killall -HUP nsqcli` in the
    first ~0.15 s of a to-file ended it, saying nothing.)"""
    hup_held = _command(argv) == "to-file"
    if hup_held:  # before the handlers: a test sees those in /proc/PID/status and sends SIGHUP
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    from .exits import stop_signals

    stops = stop_signals(own_hup=hup_held)
    for sig in stops:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _early_exit)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(stops))


def _command(argv: list[str]) -> str | None:
    """The subcommand of a command line: its first word that is not an option of the group
    (--context NAME is the group's only option with a value)."""
    it = iter(argv)
    for word in it:
        if word == "--context":
            next(it, None)
        elif not word.startswith("-"):
            return word
    return None


def main() -> None:
    install_early_signals(sys.argv[1:])  # first thing, before click, rich and the client core
    from .stdio import repair_closed_streams

    repair_closed_streams()  # `<&-`, `>&-`, `2>&-`: the same on the fast path as through click
    if "NSQCLI_HANDOFF" in os.environ:  # this image was exec()ed by a command handing itself off
        from .cli.handoff import resume

        resume()
    if os.environ.get("NSQCLI_NO_FAST_PATH", "") in ("", "0"):
        plan = fast_pub_plan(sys.argv[1:])
        if plan is not None:
            from .exits import exit_now, outcome

            exit_now(outcome(lambda: _publish(plan)))  # the click command's exit path, without teardown
    from .cli import handoff
    from .cli import main as cli_main

    handoff.enable(main)  # a daemon may continue in a fresh image without click (nsqcli.cli.handoff)
    cli_main()


# -- the `pub` fast path --------------------------------------------------------------------

_VALUED = {"-t": "topic", "--topic": "topic", "--nsqd-tcp-address": "nsqd", "--timeout": "timeout",
           "--defer": "defer"}
_FLAGS = {"--json": "as_json", "--fanout": "fanout", "-q": "quiet", "--quiet": "quiet"}


def fast_pub_plan(argv: list[str]) -> dict | None:
    """The parsed `pub` invocation, or None when click must handle it (nothing consumed yet)."""
    if not argv or argv[0] != "pub" or _context_may_apply():
        return None
    from .defaults import PUB_FAST_PATH, PUB_TIMEOUT

    if "_NSQCLI_COMPLETE" in os.environ or any(k.startswith("NSQCLI_") and k not in PUB_FAST_PATH
                                                for k in os.environ):
        return None
    plan = {"topic": None, "nsqd": [], "timeout": PUB_TIMEOUT, "defer": None, "as_json": False, "fanout": False,
            "quiet": False}
    args: list[str] = []
    given: set[str] = set()
    it = iter(argv[1:])
    for arg in it:
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in _VALUED:
            if not eq:
                value = next(it, None)
                if value is None or (value.startswith("-") and value != "-"):
                    return None  # click's own message for a missing or option-like value
            if _VALUED[name] == "nsqd":
                plan["nsqd"].append(value)
            elif _VALUED[name] in given:
                return None  # given twice: click refuses it (nsqcli.cli.footguns)
            else:
                plan[_VALUED[name]] = value
                given.add(_VALUED[name])
        elif name in _FLAGS and not eq:
            plan[_FLAGS[name]] = True
        elif arg.startswith("-") and arg != "-":
            return None  # any other option, --help, -v, --, a joined -tTOPIC
        else:
            args.append(arg)
    plan["timeout_given"] = "timeout" in given
    return _checked(plan, args)


def _checked(plan: dict, args: list[str]) -> dict | None:
    """Values checked as click's types would; None (to click) for any that click would refuse."""
    from .client.transport import split_address
    from .defaults import NSQD_TCP_ADDRESS
    from .errors import LocalProtocolError
    from .protocol.names import validate_topic

    if plan["topic"] is None:
        if not args:
            return None
        plan["topic"] = args.pop(0)
    if len(args) > 1:
        return None
    plan["message"] = args[0] if args else None
    if not plan["nsqd"]:
        env = os.environ.get("NSQCLI_NSQD_TCP_ADDRESS", "")
        plan["nsqd"] = env.split() if env else []
        if env and not plan["nsqd"]:
            return None
    if any("://" in a or "," in a for a in plan["nsqd"]):
        return None  # a scheme or a comma list: click's footgun message
    try:
        validate_topic(plan["topic"])
        for address in plan["nsqd"]:
            split_address(address)
    except (LocalProtocolError, ValueError):
        return None
    plan["nsqd"] = plan["nsqd"] or [NSQD_TCP_ADDRESS]
    for key in ("timeout", "defer"):
        if plan[key] is not None:
            plan[key] = _duration(plan[key])
            if plan[key] is None:
                return None
    if plan["timeout"] <= 0:
        return None
    return plan


def _duration(text: str) -> float | None:
    """cli.types.Duration's parse (nsqcli.clock.parse_duration); None if it would fail."""
    from .clock import parse_duration

    try:
        return parse_duration(text)
    except ValueError:
        return None


def _context_may_apply() -> bool:
    """A selected context (config.toml not empty) may change pub's defaults: click's path."""
    from .defaults import contexts_dir

    try:
        with open(os.path.join(contexts_dir(), "config.toml"), "rb") as f:
            return bool(f.read().strip())
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _publish(plan: dict) -> int:
    """The click command's publish (nsqcli.publish.publish_one) with the plan's options and the
    Config that nsqcli.cli.options.build_config makes when no connection option is given."""
    from .client.config import Config
    from .exits import Voice
    from .publish import publish_one

    return publish_one(Voice(-1 if plan["quiet"] else 0), plan["topic"], plan["message"], cfg=Config(),
                       resolve=lambda deadline: plan["nsqd"], timeout=plan["timeout"],
                       timeout_given=plan["timeout_given"], defer=plan["defer"], fanout=plan["fanout"],
                       as_json=plan["as_json"])
