"""The root command, help, version, completion and man pages (cli/__init__.py, cli/docs.py, commands/meta.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from tests.support.helpers import NSQCLI, clean_env, one_error_line, run_nsqcli, topic_stats
from tests.support.helpers import run_nsqcli as run

ROOT = Path(__file__).resolve().parent.parent.parent




def test_version_and_help():
    r = run(["--version"])
    assert r.returncode == 0 and r.stdout.startswith(b"nsqcli, version ")
    r = run(["pub", "--help"])
    assert b"NSQCLI_NSQD_TCP_ADDRESS" in r.stdout and b"127.0.0.1:4150" in r.stdout


# -- first steps -----------------------------------------------------------------------------------
def test_bare_nsqcli_prints_help_and_exits_0():
    r = run_nsqcli([])
    assert r.returncode == 0 and r.stderr == b""
    out = r.stdout.decode()
    assert out.startswith("Usage: nsqcli") and "Start here:" in out
    for cmd in ("tail", "pub", "doctor", "context", "completion", "man", "version"):
        assert re.search(rf"^  {cmd}\b", out, re.M), cmd


def test_version_names_nsqcli_python_and_the_spark_extra():
    from importlib import metadata

    from nsqcli import __version__

    doc = json.loads(run_nsqcli(["version", "--json"]).stdout)
    assert doc["nsqcli"] == __version__ and doc["python"].count(".") == 2
    assert doc["pyspark"] == metadata.version("pyspark") and doc["nsqd"].startswith("v1.3.0")
    text = run_nsqcli(["version"]).stdout.decode()
    assert re.search(rf"^nsqcli\s+{re.escape(__version__)}$", text, re.M) and re.search(r"^pyspark\s+4\.", text, re.M)


@pytest.mark.parametrize("shell,name", [("bash", "nsqcli.bash"), ("zsh", "_nsqcli"), ("fish", "nsqcli.fish")])
def test_completion_command_prints_the_shipped_script(shell, name):
    r = run_nsqcli(["completion", shell])
    assert r.returncode == 0 and r.stdout.decode() == (ROOT / "completions" / name).read_text()
    assert "_NSQCLI_COMPLETE" in r.stdout.decode()


def test_completion_script_really_completes_in_bash():
    """Source the script in a real bash and ask it to complete `nsqcli ta<TAB>`."""
    script = run_nsqcli(["completion", "bash"]).stdout.decode()
    bindir = Path(NSQCLI[0]).parent
    prog = f"""
{script}
COMP_WORDS=(nsqcli ta); COMP_CWORD=1
_nsqcli_completion nsqcli
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = clean_env({"PATH": f"{bindir}:{os.environ['PATH']}"})
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, env=env, timeout=30)
    assert "tail" in r.stdout.split(), (r.stdout, r.stderr)


def test_man_pages_are_reachable_from_a_pip_install(tmp_path):
    r = run_nsqcli(["man", "tail"])
    text = r.stdout.decode()
    assert r.returncode == 0 and text.startswith(".TH NSQCLI-TAIL 1") and ".SH EXAMPLES" in text
    assert ".SH CONNECTION OPTIONS" in text and text.index(".SH OPTIONS") < text.index(".SH CONNECTION OPTIONS")
    r = run_nsqcli(["man", "--write", str(tmp_path)])
    assert r.returncode == 0 and (tmp_path / "nsqcli-doctor.1").read_text().startswith(".TH NSQCLI-DOCTOR")
    one_error_line(run_nsqcli(["man", "nope"]), 2, r"no manual page for 'nope' \(commands: .*tail")


def test_every_help_has_examples_and_own_options_first():
    from nsqcli.cli import COMMANDS

    for name in COMMANDS:
        args = [name, "add", "--help"] if name == "context" else [name, "--help"]
        out = run_nsqcli(args).stdout.decode()
        assert "Examples:" in out, name
        if "Connection options:" in out:
            assert out.index("Options:") < out.index("Connection options:") < out.index("Examples:"), name
            own = out[out.index("Options:"):out.index("Connection options:")]
            assert "--nsqd-tcp-address" not in own and "--tls " not in own, name


def test_global_flags_work_after_the_subcommand(nsqd, topic):
    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address}
    r = run_nsqcli(["pub", topic, "x", "--auth-secret", "s", "-q"], env)
    assert r.returncode == 0 and r.stderr == b""  # the AUTH warning is silenced by -q
    r = run_nsqcli(["pub", topic, "x", "--auth-secret", "s"], env)
    assert r.returncode == 0
    assert r.stderr.decode() == ("nsqcli: warning: --auth-secret on the command line is visible to every user in "
                                 "'ps': use --auth-secret-file or NSQCLI_AUTH_SECRET\n"
                                 f"nsqcli: warning: nsqd {nsqd.tcp_address} does not use AUTH: the --auth-secret "
                                 "was not sent (is this the cluster you meant?)\n")
    r = run_nsqcli(["pub", topic, "x", "-v"], env)
    assert r.returncode == 0 and f"published 1 bytes to {nsqd.tcp_address}" in r.stderr.decode()
    assert topic_stats(nsqd, topic)["message_count"] == 3
