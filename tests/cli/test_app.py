"""The CLI machinery shared by every command (cli/app.py): signals, outages, stderr lines."""

from __future__ import annotations

import re
import signal
import subprocess
import time

from tests.support.helpers import NSQCLI, clean_env


# -- signals at start-up, warnings that repeat, whole lines on stderr ---------------------------------
def _block_stop_signals():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def test_a_signal_in_the_first_moments_exits_cleanly(nsqd, topic):
    """SIGTERM/SIGINT/SIGHUP at any moment of start-up (0-150 ms: while Python starts, while click
    and the client core are imported, while tail connects): no traceback, a documented exit code.
    The signals are blocked across exec (as a supervisor may leave them), so every delay lands on
    nsqcli's own code whatever the machine's speed: nsqcli installs its handling first thing, then
    unblocks them (before the fix the signals stayed pending and tail ran on; SIGHUP stayed
    pending until the fix of the session after)."""
    delays = [0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.004, 0.04]
    for i, delay in enumerate(delays):
        sig = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)[i % 3]
        p = subprocess.Popen(NSQCLI + ["tail", topic, "-c", "early#ephemeral", "--nsqd-tcp-address", nsqd.tcp_address],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
                             preexec_fn=_block_stop_signals)
        time.sleep(delay)
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise AssertionError(f"{sig.name} after {delay}s was never handled") from None
        text = err.decode(errors="replace")
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (sig.name, delay, text)
        assert p.returncode in (0, 128 + sig), (sig.name, delay, p.returncode, text)
        assert all(ln.startswith("nsqcli: ") for ln in text.splitlines()), (sig.name, delay, text)


def test_outages_said_when_they_start_counted_while_they_last_and_recovered():
    from nsqcli.cli.app import App, Outages

    said = []
    app = App()
    app.warn = lambda t: said.append("warning: " + t)
    app.info = lambda t: said.append(t)
    now = [100.0]
    o = Outages(app, every=30.0, clock=lambda: now[0], wall=lambda: 0.0)
    for _ in range(9):  # one server failing the same way on every reconnect
        o.failed("a", "a: refused")
        now[0] += 1
    assert said == ["warning: a: refused"]
    now[0] += 30
    o.failed("a", "a: refused")  # due again: said with the count
    o.failed("a", "a: timed out")  # changed: said at once
    assert said[1].startswith("warning: a: refused (x10 since ") and said[2].startswith("warning: a: timed out (x11 ")
    o.ok("b")  # was not failing: nothing
    o.ok("a", "nsqd a")
    assert said[3].startswith("recovered: nsqd a (11 failures since ") and len(said) == 4
    o.ok("a")
    o.failed("a", "a: refused")  # a later outage is said again
    assert said[4:] == ["warning: a: refused"]


def test_stderr_lines_from_many_threads_stay_whole(tmp_path):
    script = tmp_path / "many.py"
    script.write_text(
        "import threading\n"
        "from nsqcli.cli.app import App\n"
        "app = App()\n"
        "def spam(n):\n"
        "    for i in range(2000):\n"
        "        (app.warn if i % 2 else app.info)(f'thread {n} line {i} ' + 'x' * (i % 50))\n"
        "ts = [threading.Thread(target=spam, args=(n,)) for n in range(8)]\n"
        "[t.start() for t in ts]\n"
        "[t.join() for t in ts]\n")
    import sys

    r = subprocess.run([sys.executable, str(script)], capture_output=True, env=clean_env(), timeout=60)
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 0 and len(lines) == 16000
    assert all(re.fullmatch(r"nsqcli: (warning: )?thread \d line \d+ x*", ln) for ln in lines), \
        [ln for ln in lines if not re.fullmatch(r"nsqcli: (warning: )?thread \d line \d+ x*", ln)][:3]


# -- refusals: bad input, unknown commands (one line, exit 2) --------------------------------------------
import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from tests.support.helpers import run_nsqcli, topic_stats  # noqa: E402
from tests.support.inprocess import run_in_process  # noqa: E402
from tests.support.refusals import DEAD, bad_input, fill, ids, refused, run_closing  # noqa: E402

BAD_INPUT = [
    (["completion"], 2, r"Missing argument .SHELL.\. Choose from: bash, zsh, fish"),
    (["completion", "tcsh"], 2, r"'tcsh' is not one of 'bash', 'zsh', 'fish'"),
    (["man", "nope"], 2, r"no manual page for 'nope' \(commands: "),
    (["version", "--bogus"], 2, r"No such option '--bogus'"),
    (["frob"], 2, r"No such command 'frob'"),
    (["--context"], 2, r"Option '--context' requires an argument"),
    (["-x"], 2, r"No such option '-x'"),
]


@pytest.mark.parametrize("args,code,pattern", BAD_INPUT, ids=ids(BAD_INPUT))
def test_bad_input(args, code, pattern):
    bad_input(args, code, pattern)


# -- the in-process runs of the usage-error rows (tests/support/inprocess.py) give what the real executable gives --
SAME_AS_THE_EXECUTABLE = [  # one argv per kind of outcome
    (["pub", "t", ""], 2),  # a usage error found on pub's fast path (nsqcli.entry)
    (["pub", "-t", "a", "-t", "b", "x"], 2),  # a usage error of the click app
    (["lookup", "--lookupd-http-address", DEAD], 1),  # a runtime error
    (["wait", "--ready", "--nsqd-http-address", DEAD, "--timeout", "1s"], 3),  # a deadline
]


@pytest.mark.parametrize("args,code", SAME_AS_THE_EXECUTABLE, ids=ids(SAME_AS_THE_EXECUTABLE))
def test_in_process_runs_give_what_the_real_executable_gives(args, code):
    real, here = run_nsqcli(args, input=b"a\n"), run_in_process(args, input=b"a\n")
    assert real.returncode == code and real.stderr.startswith(b"nsqcli: error: "), real  # and only that line
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)


def test_an_in_process_run_leaves_the_process_as_it_was(tmp_path):
    """A context's variables, the early signal handlers, the fast path's exit: all put back."""
    import logging
    import os
    import signal
    import sys

    import nsqcli.exits

    before = (dict(os.environ), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.stdout,
              sys.stderr, list(logging.root.handlers), nsqcli.exits.exit_now)
    (tmp_path / "contexts").mkdir()
    (tmp_path / "contexts" / "c.toml").write_text('nsqd-tcp-address = ["127.0.0.1:1"]\n')
    r = run_in_process(["pub", "t", "", "--context", "c"], {"NSQCLI_CONFIG_DIR": str(tmp_path)})
    assert r.returncode == 2 and b"the message is empty" in r.stderr, r
    assert run_in_process(["pub", "t", ""]).returncode == 2  # the fast path: its exit is os._exit otherwise
    assert (dict(os.environ), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.stdout,
            sys.stderr, list(logging.root.handlers), nsqcli.exits.exit_now) == before


#: the test files holding the bad-input table (issue 12's), one per command
BAD_INPUT_FILES = ("test_pub", "test_mpub", "test_tail", "test_wait", "test_check", "test_exec", "test_to_file",
                   "test_lookup", "test_stat", "test_sandbox", "test_context", "test_doctor", "test_app", "test_to_nsq",
                   "test_to_http", "test_admin", "test_bench", "test_replay", "test_query", "test_to_parquet",
                   "test_envvars")


def test_the_table_is_the_issue_s_size():
    import importlib

    modules = [importlib.import_module(("tests." if name == "test_sandbox" else "tests.cli.") + name)
               for name in BAD_INPUT_FILES]
    assert sum(len(getattr(m, "BAD_INPUT", ())) + len(getattr(m, "BAD_ENVIRONMENT", ())) for m in modules) >= 109


@pytest.mark.parametrize("args,pattern", [
    (["tial"], r"^nsqcli: error: No such command 'tial'\. Did you mean 'tail'\? \(see 'nsqcli --help'\)$"),
    (["topic", "craete", "x"], r"No such command 'craete'\. Did you mean 'create'\?"),
    (["bench", "sbu"], r"No such command 'sbu'\. Did you mean 'sub'\?"),
    (["help", "tial"], r"No such command 'tial'\. Did you mean 'tail'\?"),
    (["help", "topic", "craete"], r"No such command 'craete'\. Did you mean 'create'\?"),
    (["qqqqq"], r"No such command 'qqqqq'"),
])
def test_unknown_command_is_one_line_with_a_suggestion(args, pattern):
    refused(run_in_process(args), 2, pattern)


# -- help: `help COMMAND` is `COMMAND --help`; an unknown command loads no command module -----------------

def _all_commands():
    from nsqcli.cli import COMMANDS

    names = [[n] for n in COMMANDS]
    return names + [["topic", "create"], ["channel", "empty"], ["node", "tombstone"], ["bench", "sub"],
                    ["context", "add"]]


@pytest.mark.parametrize("path", _all_commands(), ids=lambda p: " ".join(p))
def test_help_command_shows_the_same_as_dash_dash_help(path):
    from nsqcli.cli import cli

    runner = CliRunner()
    a, b = runner.invoke(cli, ["help", *path], prog_name="nsqcli"), runner.invoke(cli, [*path, "--help"], prog_name="nsqcli")
    assert a.exit_code == b.exit_code == 0, (a.output, b.output)
    assert a.output == b.output and "Usage: nsqcli " + " ".join(path) in a.output


def test_help_alone_is_the_root_help():
    from nsqcli.cli import cli

    runner = CliRunner()
    a = runner.invoke(cli, ["help"], prog_name="nsqcli").output
    assert a == runner.invoke(cli, ["--help"], prog_name="nsqcli").output and "help" in a


def test_an_unknown_command_loads_no_command_module():
    code = ("import sys; from nsqcli.cli import cli; from nsqcli.cli.app import run\n"
            "try:\n    run(cli, ['tial'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('nsqcli.cli.commands.')))")
    r = subprocess.run([*NSQCLI[:1], "-c", code], capture_output=True, env=clean_env(), timeout=30)
    assert r.stdout.strip() == b"[]", r.stdout


# -- a closed stdout is never an error ---------------------------------------------------------------------

CLOSED_STDOUT = [
    ["pub", "{t}", "kept", "--json", "--nsqd-tcp-address", "{tcp}"],
    ["mpub", "-t", "{t}", "--json", "--nsqd-tcp-address", "{tcp}"],
    ["tail", "{t}", "-n", "1", "--drain-backlog", "--nsqd-tcp-address", "{tcp}"],
    ["lookup"], ["lookup", "--json"], ["lookup", "--nodes"],
    ["stat", "-n", "1", "--no-live", "--interval", "0.2s"], ["stat", "-n", "1", "--json", "--interval", "0.2s"],
    ["topic", "create", "{t}_admin", "--nsqd-http-address", "{http}"], ["topic", "pause", "{t}", "--dry-run"],
    ["doctor", "--nsqd-tcp-address", "{tcp}", "--nsqd-http-address", "{http}"],
    ["context", "ls", "--json"], ["version"], ["completion", "bash"], ["man", "pub"],
]


@pytest.mark.parametrize("how", ["closed", "pipe"])
@pytest.mark.parametrize("args", CLOSED_STDOUT, ids=[" ".join(a)[:40] for a in CLOSED_STDOUT])
def test_a_closed_stdout_is_never_an_error(nsqd, lookupd, topic, args, how):
    """`>&-` and a pipe whose reader is gone: exit 0, nothing on stderr but what the command says
    anyway (no error, no traceback, no 'Exception ignored'), and the work that needs no stdout done."""
    import os
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env, http_post

    http_post(nsqd.http_address, "/pub", b"before", topic=topic)
    env = clean_env({"NSQCLI_LOOKUPD_HTTP_ADDRESS": lookupd.http_address,
                     "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address})
    argv = NSQCLI + fill(args, nsqd, topic)
    if how == "closed":
        r = subprocess.run(["bash", "-c", 'exec "$@" >&-', "-", *argv], input=b"rec\n", capture_output=False,
                           stderr=subprocess.PIPE, env=env, timeout=60)
    else:
        rd, wr = os.pipe()
        os.close(rd)
        try:
            r = subprocess.run(argv, input=b"rec\n", stdout=wr, stderr=subprocess.PIPE, env=env, timeout=60)
        finally:
            os.close(wr)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert not re.search(r"error|Traceback|Exception ignored", err), err
    if args[0] in ("pub", "mpub"):
        assert topic_stats(nsqd, topic)["message_count"] == 2  # published all the same


@pytest.mark.parametrize("args", [["--help"], ["pub", "--help"], [], ["-V"], ["topic"]],
                         ids=["--help", "pub --help", "bare", "-V", "group"])
def test_help_and_version_to_a_closed_stdout_exit_0(args):
    """`nsqcli --help >&-` and `nsqcli --help | head -0` exit 1 (click.main turns the EPIPE of its
    own echo into sys.exit(1)), while `nsqcli help pub >&-` and every command's output exit 0:
    a closed stdout is meant to end every command as a closed pipe does, quietly with 0."""
    r = run_closing(args, close=(1,))
    assert (r.returncode, r.stderr) == (0, b"")
