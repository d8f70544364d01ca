"""The ``nsqcli`` console script and ``python -m nsqcli``: early signals, the `pub` fast path,
else the click app (nsqcli.cli).

Why this module is outside cli/: importing anything in nsqcli.cli imports click, and click
alone (inspect, typing, uuid, datetime, gettext ...) costs ~35 ms on a slow machine, most of
the 40 ms `nsqcli pub` may take from exec to exit in a shell loop. So a plain publish, `nsqcli
pub [-t] TOPIC [MESSAGE]` with the few options scripts use, is parsed here without click and
published with the same client core; anything this parser does not fully understand - another
option, --help, a bad value, a context that may apply, another NSQCLI_* variable, `-` options
before `pub` - goes to click untouched, before anything was read or sent. What the fast path
prints and its exit codes are those of the click command (nsqcli.cli.commands.pub and the one
exit path nsqcli.cli.app.run); tests/cli/test_pub_fast_path.py runs one argv matrix through both
and compares stdout, stderr and exit code. NSQCLI_NO_FAST_PATH=1 turns the fast path off.
"""

from __future__ import annotations

import os
import signal
import sys

from .clock import STARTED  # noqa: F401 - first: `--timeout` counts from process start (nsqcli.clock)


#: what an early exit adds to its line (`pub`: whether its message may be published already)
_interrupt_note = ""


def _early_exit(signum, frame):
    name = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}.get(signum, str(signum))
    try:
        os.write(2, f"nsqcli: interrupted ({name}){_interrupt_note}\n".encode())
    finally:
        os._exit(128 + signum)


def _pub_progress(address: str, state: str) -> None:
    """Producer.on_publish for the fast path (the click command does the same: nsqcli.cli.
    commands.pub): a signal after the PUB was written says the message may be published, not
    just "interrupted" (which reads as: nothing happened)."""
    global _interrupt_note
    from .client.producer import interrupt_note

    _interrupt_note = interrupt_note(address, state)


def install_early_signals() -> None:
    """SIGINT/SIGTERM exit at once with the documented code (130 / 143) and one line, instead
    of a KeyboardInterrupt traceback or a bare death by signal, until a command installs its own
    handling (a clean stop, nsqcli.cli.app). A signal a parent made us ignore stays ignored;
    the two are unblocked in case a parent blocked them across exec."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _early_exit)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def main() -> None:
    install_early_signals()  # first thing, before click, rich and the client core
    from .stdio import repair_closed_streams

    repair_closed_streams()  # `<&-`, `>&-`, `2>&-`: the same on the fast path as through click
    if "NSQCLI_HANDOFF" in os.environ:  # this image was exec()ed by a command handing itself off
        from .cli.handoff import resume

        resume()
    if os.environ.get("NSQCLI_NO_FAST_PATH", "") in ("", "0"):
        plan = fast_pub_plan(sys.argv[1:])
        if plan is not None:
            _exit_now(_guarded(plan))
    from .cli import handoff
    from .cli import main as cli_main

    handoff.enable(main)  # a daemon may continue in a fresh image without click (nsqcli.cli.handoff)
    cli_main()


# -- the `pub` fast path --------------------------------------------------------------------

#: NSQCLI_* variables the fast path honours, or that no option of pub reads (set by `nsqcli
#: sandbox` or for other commands); any other one set sends the run to click, which knows them all
_ENV_KNOWN = {"NSQCLI_NSQD_TCP_ADDRESS", "NSQCLI_DEBUG", "NSQCLI_CONFIG_DIR", "NSQCLI_NO_FAST_PATH", "NSQCLI_NO_HANDOFF",
              "NSQCLI_NSQD_HTTP_ADDRESS", "NSQCLI_SANDBOX_PID", "NSQCLI_NSQ_BIN", "NSQCLI_SPARK_MASTER",
              "NSQCLI_SPARK_REMOTE", "NSQCLI_DESTINATION_AUTH_SECRET"}
_VALUED = {"-t": "topic", "--topic": "topic", "--nsqd-tcp-address": "nsqd", "--timeout": "timeout",
           "--defer": "defer"}
_FLAGS = {"--json": "as_json", "--fanout": "fanout", "-q": "quiet", "--quiet": "quiet"}


def fast_pub_plan(argv: list[str]) -> dict | None:
    """The parsed `pub` invocation, or None when click must handle it (nothing consumed yet)."""
    if not argv or argv[0] != "pub" or _context_may_apply():
        return None
    if "_NSQCLI_COMPLETE" in os.environ or any(k.startswith("NSQCLI_") and k not in _ENV_KNOWN
                                                for k in os.environ):
        return None
    plan = {"topic": None, "nsqd": [], "timeout": "10s", "defer": None, "as_json": False, "fanout": False,
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
    plan["nsqd"] = plan["nsqd"] or ["127.0.0.1:4150"]
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
    base = os.environ.get("NSQCLI_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "nsqcli")
    try:
        with open(os.path.join(base, "config.toml"), "rb") as f:
            return bool(f.read().strip())
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _Deadline(Exception):
    pass


def _guarded(plan: dict) -> int:
    """nsqcli.cli.app.run's mapping of outcomes to messages and exit codes, for what pub raises."""
    from .errors import NSQError

    try:
        return _publish(plan)
    except _Deadline as e:
        return _fail(str(e), 3)
    except NSQError as e:
        return _fail(str(e), 1)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        _say("nsqcli: interrupted")
        return 130
    except OSError as e:
        _silence_stdout()
        return _fail(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", 1)
    except Exception as e:
        return _fail(f"internal error: {type(e).__name__}: {e} (NSQCLI_DEBUG=1 shows where)", 1)


def _exit_now(code: int) -> None:
    """Flush and leave without the interpreter's teardown: it restores the default signal
    dispositions first, so a Ctrl-C in those milliseconds killed a pub whose message nsqd had
    taken without a line (and teardown is time a shell loop pays for every message)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            _silence_stdout()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def _fail(message: str, code: int) -> int:
    if os.environ.get("NSQCLI_DEBUG", "") not in ("", "0"):
        import traceback

        traceback.print_exc()
    _say(f"nsqcli: error: {message}")
    return code


def _silence_stdout() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _publish(plan: dict) -> int:
    """The body of nsqcli.cli.commands.pub.pub for the plan's options."""
    import time

    from .client.config import Config
    from .client.producer import Producer
    from .errors import PublishError

    cfg = Config()  # what cli.options.build_config makes when no connection option but nsqd is given
    message = plan["message"]
    if message is None or message == "-":
        if sys.stdin.isatty() and message is None and not plan["quiet"]:
            _say("nsqcli: reading the message from stdin (Ctrl-D to end)")
        from .stdio import ReadTimeout, read_all

        try:  # a --timeout given bounds the read too; the default one starts at the end of input
            body = read_all(sys.stdin.buffer, STARTED + plan["timeout"] if plan["timeout_given"] else None)
        except ReadTimeout as e:
            raise _Deadline(e.line) from None
        start = STARTED if plan["timeout_given"] else time.monotonic()
    else:
        body = message.encode("utf-8", "surrogateescape")
        start = STARTED
    if not body:
        _say("nsqcli: error: the message is empty (nsqd rejects empty messages) (see 'nsqcli pub --help')")
        return 2
    deadline = start + plan["timeout"]  # cli.options.deadline_of: from process start
    producer = Producer(plan["nsqd"], cfg, fanout=plan["fanout"], deadline=deadline)
    producer.on_publish = _pub_progress
    try:
        acked = producer.publish(plan["topic"], body, defer=plan["defer"], timeout=plan["timeout"])
    except PublishError as e:
        from .client.producer import size_note

        # exit 3 only when the deadline did pass (a handshake's own Timeout - its share of the
        # deadline, with several nsqd - is a failure, 1); a wait that ended at it may wake a hair early
        if time.monotonic() >= deadline - 0.01:
            raise _Deadline(f"--timeout passed: {e}{size_note(len(body), e)}") from e
        if size_note(len(body), e):
            raise PublishError(f"{e}{size_note(len(body), e)}", e.published, e.failed, e.cause) from e
        raise
    finally:
        producer.close(timeout=max(0.1, deadline - time.monotonic()))
    if producer.maybe_held and not plan["quiet"]:
        from .client.producer import resend_note

        _say(f"nsqcli: warning: {resend_note(producer.maybe_held, acked)}")
    if plan["as_json"]:
        import json

        sys.stdout.write(json.dumps({"topic": plan["topic"], "bytes": len(body), "acknowledged_by": list(acked),
                                     "published": 1}) + "\n")
        sys.stdout.flush()
    return 0
