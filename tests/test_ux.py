"""What a new user meets first (issue 12): help, version, completion, man pages, the detached
sandbox, contexts, doctor, strict flags, tail's backlog guard, no silent waits, and live views
that fit 80 and 120 columns. Everything runs the real nsqcli against real nsqd/nsqlookupd."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import NSQCLI, clean_env, http_get_json, http_post, run_nsqcli, topic_stats, wait_for

ROOT = Path(__file__).resolve().parent.parent


def one_error_line(r, code: int, pattern: str) -> str:
    err = r.stderr.decode()
    assert r.returncode == code, (r.returncode, err)
    lines = [ln for ln in err.splitlines() if not ln.startswith("nsqcli: warning:")]
    assert len(lines) == 1 and lines[0].startswith("nsqcli: error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    return lines[0]


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


# -- sandbox ---------------------------------------------------------------------------------------
def test_documented_detached_sandbox_line_works_in_a_shell(tmp_path):
    """`eval "$(nsqcli sandbox --detach)"` returns (no hang), points the shell at a real NSQ,
    saves a context, and `kill $NSQCLI_SANDBOX_PID` stops every process."""
    bindir = Path(NSQCLI[0]).parent
    cfg = tmp_path / "cfg"
    script = f"""
set -e
nsqcli() {{ "{NSQCLI[0]}" -m nsqcli "$@"; }}
eval "$(nsqcli sandbox --detach --nodes 2 --save-context box)"
echo "pid=$NSQCLI_SANDBOX_PID"
echo "nsqd=$NSQCLI_NSQD_TCP_ADDRESS"
nsqcli pub tour 'hello' --json
nsqcli tail tour -c first -n 1
nsqcli stat -n 1 --no-live -t tour --per-node | wc -l | sed 's/^/statlines=/'
kill $NSQCLI_SANDBOX_PID
"""
    t0 = time.monotonic()
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                       env=clean_env({"NSQCLI_CONFIG_DIR": str(cfg), "PATH": f"{bindir}:{os.environ['PATH']}"}))
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    out = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if re.match(r"^(pid|nsqd|statlines)=", ln))
    lines = r.stdout.splitlines()
    assert json.loads(lines[2])["published"] == 1 and lines[3] == "hello"
    assert len(out["nsqd"].split()) == 2
    assert int(out["statlines"]) == 2 + 2  # header + a row per node: the whole cluster
    saved = json.loads(run_nsqcli(["context", "show", "box", "--json"], {"NSQCLI_CONFIG_DIR": str(cfg)}).stdout)
    assert saved["nsqd-tcp-address"] == out["nsqd"].split()
    pid = int(out["pid"])
    wait_for(lambda: not _alive(pid), timeout=15, what="sandbox stopped")
    ports = [a.rsplit(":", 1)[1] for a in saved["nsqd-tcp-address"]]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not any(f":{p}" in ps for p in ports), "an nsqd of the detached sandbox is still running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def pip_like_env(tmp_path, **extra) -> dict:
    """nsqcli as pip installs it: the package alone (no clone's .nsq/bin next to it)."""
    import shutil

    site = tmp_path / "site"
    if not site.exists():
        shutil.copytree(ROOT / "nsqcli", site / "nsqcli", ignore=shutil.ignore_patterns("__pycache__"))
    return clean_env({"PATH": "/usr/bin:/bin", "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path),
                      "PYTHONPATH": str(site), **extra})


def test_sandbox_without_nsqd_says_what_to_do(tmp_path):
    """A pip install without nsqd and without Go."""
    env = pip_like_env(tmp_path)
    for args in (["sandbox"], ["sandbox", "--detach"]):
        r = subprocess.run(NSQCLI + args, capture_output=True, timeout=30, env=env, cwd=tmp_path)
        one_error_line(r, 1, r"nsq(lookup)?d not found \(looked in .*\): run 'nsqcli sandbox --install'")
    r = subprocess.run(NSQCLI + ["sandbox", "--install"], capture_output=True, timeout=30, env=env, cwd=tmp_path)
    one_error_line(r, 1, r"'go' not found on PATH\. Install Go")


def test_sandbox_install_builds_into_the_user_data_dir(tmp_path):
    """`nsqcli sandbox --install` with Go present: the same build as scripts/install-nsq (the
    Go module cache is shared with the project's, so only the build runs)."""
    import shutil

    from nsqcli import nsq_install

    data = tmp_path / "data"
    bindir = data / "nsqcli" / f"nsq-{nsq_install.NSQ_VERSION}" / "bin"
    # reuse the project's Go caches: the module is already downloaded there by scripts/install-nsq
    (data / "nsqcli").mkdir(parents=True)
    os.symlink(ROOT / ".nsq" / "go", data / "nsqcli" / "go")
    go = Path(shutil.which("go")).parent
    env = pip_like_env(tmp_path, PATH=f"{go}:/usr/bin:/bin")
    r = subprocess.run(NSQCLI + ["sandbox", "--install"], capture_output=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert f"installed into {bindir}" in r.stderr.decode()
    assert subprocess.run([bindir / "nsqd", "--version"], capture_output=True, text=True).stdout.startswith("nsqd v1.3.0")
    r = subprocess.run(NSQCLI + ["version", "--json"], capture_output=True, timeout=30, cwd=tmp_path, env=env)
    assert json.loads(r.stdout)["nsqd"] == f"v1.3.0 ({bindir}/nsqd)"
    # and the sandbox runs from there
    r = subprocess.run(["bash", "-c", f"eval \"$('{NSQCLI[0]}' -m nsqcli sandbox --detach)\"; "
                        f"'{NSQCLI[0]}' -m nsqcli pub x y && kill $NSQCLI_SANDBOX_PID"],
                       capture_output=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# -- contexts --------------------------------------------------------------------------------------
def test_contexts_add_select_override_and_remove(nsqd, topic, tmp_path):
    cfg = {"NSQCLI_CONFIG_DIR": str(tmp_path / "cfg")}
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-value\n")
    r = run_nsqcli(["context", "add", "live", "--nsqd-tcp-address", nsqd.tcp_address, "--nsqd-http-address",
                    nsqd.http_address, "--auth-secret-file", str(secret), "--description", "the test nsqd"], cfg)
    assert r.returncode == 0, r.stderr
    run_nsqcli(["context", "add", "dead", "--nsqd-tcp-address", "127.0.0.1:1"], cfg)
    # one_error_line: adding it again without --force
    one_error_line(run_nsqcli(["context", "add", "dead", "--nsqd-tcp-address", "127.0.0.1:1"], cfg), 2,
                   r"context 'dead' exists \(use --force")
    # the secret is stored by reference and never shown
    toml = (tmp_path / "cfg" / "contexts" / "live.toml").read_text()
    assert "s3cr3t" not in toml and str(secret) in toml
    shown = run_nsqcli(["context", "show", "live"], cfg).stdout.decode()
    assert "s3cr3t" not in shown and f"auth-secret-file: {secret}" in shown
    # --context NAME: pub goes to the context's nsqd (the secret's AUTH warning proves it was read)
    r = run_nsqcli(["--context", "live", "pub", topic, "one"], cfg)
    assert r.returncode == 0 and b"does not use AUTH" in r.stderr
    # after the subcommand, and through NSQCLI_CONTEXT
    assert run_nsqcli(["pub", topic, "two", "--context", "live", "-q"], cfg).returncode == 0
    assert run_nsqcli(["pub", topic, "three", "-q"], {**cfg, "NSQCLI_CONTEXT": "live"}).returncode == 0
    # selected context; a flag and an env var override it
    run_nsqcli(["context", "select", "dead"], cfg)
    assert run_nsqcli(["context", "ls"], cfg).stdout.decode().splitlines() == ["* dead", "  live  the test nsqd"]
    one_error_line(run_nsqcli(["pub", topic, "x"], cfg), 1, r"127\.0\.0\.1:1: cannot connect")
    assert run_nsqcli(["pub", topic, "four", "--nsqd-tcp-address", nsqd.tcp_address], cfg).returncode == 0
    assert run_nsqcli(["pub", topic, "five"], {**cfg, "NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address}).returncode == 0
    assert run_nsqcli(["--context", "none", "pub", topic, "six", "--nsqd-tcp-address", nsqd.tcp_address],
                      cfg).returncode == 0
    assert topic_stats(nsqd, topic)["message_count"] == 6
    # stat takes the context's nsqd HTTP address
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--no-live", "--context", "live"], cfg)
    assert r.returncode == 0 and r.stdout.decode().splitlines()[2].split("|")[1].split()[0] == "6"
    one_error_line(run_nsqcli(["--context", "nope", "pub", topic, "x"], cfg), 2,
                   r"no context named 'nope' \(known: dead, live")
    assert run_nsqcli(["context", "rm", "dead"], cfg).returncode == 0
    assert json.loads(run_nsqcli(["context", "ls", "--json"], cfg).stdout) == [
        {"name": "live", "selected": False, "description": "the test nsqd"}]
    one_error_line(run_nsqcli(["context", "add", "x", "--auth-secret", "inline"], cfg), 2,
                   r"No such option '--auth-secret'\. \(Did you mean one of: '--auth-secret-file'")


# -- doctor ----------------------------------------------------------------------------------------
def test_doctor_checks_the_cluster(nsqd, lookupd, topic):
    http_post(nsqd.http_address, "/pub", b"x", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="c1")
    env = {"NSQCLI_LOOKUPD_HTTP_ADDRESS": lookupd.http_address}
    wait_for(lambda: topic in run_nsqcli(["lookup"], env).stdout.decode(), what="lookupd knows the topic")
    r = run_nsqcli(["doctor", "-t", topic, "--json"], env)
    assert r.returncode == 0, r.stdout
    doc = json.loads(r.stdout)
    assert doc["ok"] is True
    targets = {c["target"]: c for c in doc["checks"]}
    assert targets[f"nsqlookupd {lookupd.http_address}"]["detail"].startswith("v1.3.0, ")
    tcp = targets[f"nsqd {nsqd.tcp_address} (TCP)"]
    assert "v1.3.0" in tcp["detail"] and "no TLS" in tcp["detail"] and "no AUTH" in tcp["detail"]
    http = targets[f"nsqd {nsqd.http_address} (HTTP)"]
    assert re.search(rf"clock skew [+-]?\d+s .*topic '{topic}': depth 0, channels c1", http["detail"])
    text = run_nsqcli(["doctor", "-t", topic], env).stdout.decode()
    assert text.splitlines()[-1].endswith("0 failed") and f"ok   nsqd {nsqd.tcp_address} (TCP): v1.3.0" in text


def test_doctor_names_port_mixups_with_the_fix(nsqd):
    r = run_nsqcli(["doctor", "--lookupd-http-address", nsqd.http_address, "--nsqd-tcp-address", nsqd.http_address,
                    "--nsqd-http-address", nsqd.tcp_address, "--json"])
    assert r.returncode == 1 and r.stderr.decode() == "nsqcli: error: 3 of 3 checks failed\n"
    checks = {c["target"].split(" ")[0] + c["target"][-6:]: c for c in json.loads(r.stdout)["checks"]}
    lk = next(c for c in json.loads(r.stdout)["checks"] if c["target"].startswith("nsqlookupd"))
    assert "(it is an nsqd)" in lk["detail"] and "usually 4161" in lk["fix"]
    tcp = next(c for c in checks.values() if c["target"].endswith("(TCP)"))
    assert tcp["status"] == "fail" and "usually 4150" in tcp["fix"] and "HTTP" in tcp["detail"]
    http = next(c for c in checks.values() if c["target"].endswith("(HTTP)"))
    assert http["status"] == "fail" and "usually 4151" in http["fix"]


def test_doctor_reports_tls_and_auth(nsqd_factory, tmp_path):
    from nsq_fixtures import AuthServer, make_cert

    cert, key = make_cert(tmp_path)
    with AuthServer({"s3cret": [(".*", [".*"], ["subscribe", "publish"])]}) as auth:
        server = nsqd_factory(tls_cert=cert, tls_key=key, auth_http_address=auth.address)
        base = ["doctor", "--json", "--nsqd-tcp-address", server.tcp_address, "--nsqd-http-address",
                server.http_address, "--tls", "--tls-ca-file", cert]
        r = run_nsqcli(base + ["--auth-secret", "s3cret"])
        assert r.returncode == 0, r.stdout
        tcp = json.loads(r.stdout)["checks"][0]
        assert ", TLS," in tcp["detail"] and "AUTH ok as 'user-s3cret'" in tcp["detail"] and "s3cret'" not in tcp["fix"]
        r = run_nsqcli(base)
        tcp = json.loads(r.stdout)["checks"][0]
        assert r.returncode == 1 and tcp["status"] == "fail" and "requires authentication" in tcp["detail"]
        assert tcp["fix"].startswith("give --auth-secret-file FILE")


# -- strict flags and no silent waits ----------------------------------------------------------------
def test_tail_refuses_to_drop_a_backlog_into_an_ephemeral_channel(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(50)), topic=topic)
    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address}
    one_error_line(run_nsqcli(["tail", topic, "-n", "1"], env), 1,
                   rf"topic '{topic}' on nsqd {nsqd.http_address} has 50 messages and no channel yet: .* "
                   r"--channel NAME, or take it anyway with --drain-backlog")
    t = topic_stats(nsqd, topic)
    assert t["depth"] == 50 and t["channels"] == []  # nothing was taken
    r = run_nsqcli(["tail", topic, "-c", "keep", "-n", "2"], env)
    assert r.returncode == 0 and r.stdout == b"m0\nm1\n"
    assert topic_stats(nsqd, topic)["channels"][0]["depth"] == 48
    # the topic has a channel now: an ephemeral tail takes nothing from it
    http_post(nsqd.http_address, "/pub", b"new", topic=topic)
    r = run_nsqcli(["tail", topic, "-n", "1", "--timeout", "5s"], env)
    assert r.returncode == 3 and r.stdout == b""  # a new ephemeral channel sees only new messages


def test_tail_says_when_the_backlog_check_could_not_be_made(nsqd, topic):
    """A direct nsqd whose HTTP port is not TCP + 1 and no --nsqd-http-address: said, not silent."""
    r = run_nsqcli(["tail", topic, "-n", "1", "--timeout", "2s", "--nsqd-tcp-address", nsqd.tcp_address])
    host, port = nsqd.tcp_address.rsplit(":", 1)
    assert r.returncode == 3 and r.stderr.decode().startswith(
        f"nsqcli: warning: could not check topic '{topic}' for a backlog without channels "
        f"(http://{host}:{int(port) + 1}/stats")
    assert "(give --nsqd-http-address to check)" in r.stderr.decode()


def test_tail_with_drain_backlog_takes_it(nsqd, topic):
    http_post(nsqd.http_address, "/mpub", b"a\nb", topic=topic)
    r = run_nsqcli(["tail", topic, "-n", "2", "--drain-backlog"], {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address})
    assert r.returncode == 0 and r.stdout == b"a\nb\n"


def test_tail_says_what_it_waits_for(lookupd, nsqd, topic):
    r = run_nsqcli(["tail", topic, "-n", "1", "--timeout", "4s", "--lookupd-http-address", lookupd.http_address])
    err = r.stderr.decode().splitlines()
    assert r.returncode == 3
    assert err[0] == (f"nsqcli: waiting for topic '{topic}': no nsqd carries it yet according to nsqlookupd "
                      f"{lookupd.http_address} (asked every 5 s; it is read as soon as it is published)")
    one_error_line(run_nsqcli(["tail", topic, "--lookupd-http-address", nsqd.http_address]), 1,
                   rf"http://{re.escape(nsqd.http_address)}: answered HTTP 404 to /lookup: not an nsqlookupd "
                   r"HTTP address \(an nsqd HTTP port, or the wrong port\?\)")


def test_tail_finds_a_topic_published_after_it_started(lookupd, nsqd, topic):
    proc = subprocess.Popen(NSQCLI + ["tail", topic, "-n", "1", "--timeout", "20s", "--lookupd-http-address",
                                      lookupd.http_address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env())
    time.sleep(1.5)
    http_post(nsqd.http_address, "/pub", b"late", topic=topic)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == b"late\n", err


def test_stat_uses_nsqd_and_lookupd_addresses_together(sandbox, extra_nsqd, topic):
    second = extra_nsqd()
    for node in (sandbox.nsqd, second):
        http_post(node.http_address, "/pub", b"x", topic=topic)
    wait_for(lambda: len(http_get_json(sandbox.lookupd.http_address, "/lookup", topic=topic)["producers"]) == 2,
             what="both nodes registered")
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--no-live", "--per-node", "--nsqd-http-address",
                    sandbox.nsqd.http_address, "--lookupd-http-address", sandbox.lookupd.http_address])
    rows = [ln for ln in r.stdout.decode().splitlines()[2:]]
    assert r.returncode == 0 and len(rows) == 2 and {ln.split()[0].split("@")[1] for ln in rows} == {
        sandbox.nsqd.http_address, second.http_address}


def test_lookup_of_an_unknown_topic_fails(lookupd, topic):
    r = run_nsqcli(["lookup", topic, "--lookupd-http-address", lookupd.http_address])
    assert r.stdout == b""
    one_error_line(r, 1, rf"topic '{topic}' is unknown to nsqlookupd {lookupd.http_address}")


def test_positional_topic_and_json_results(nsqd, topic):
    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address}
    r = run_nsqcli(["pub", topic, "hello", "--json"], env)
    assert json.loads(r.stdout) == {"topic": topic, "bytes": 5, "acknowledged_by": [nsqd.tcp_address], "published": 1}
    r = run_nsqcli(["mpub", "-t", topic, "-n", "3", "--json"], env, input=b"a\nb\nc\nd\ne\n")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and (doc["published"], doc["resume_skip"], doc["failed"], doc["error"]) == (3, 3, 0, None)
    r = run_nsqcli(["mpub", "-t", topic, "--skip", str(doc["resume_skip"]), "--json"], env, input=b"a\nb\nc\nd\ne\n")
    assert json.loads(r.stdout)["published"] == 2
    r = run_nsqcli(["tail", topic, "-c", "all", "-n", "6"], env)
    assert r.stdout == b"hello\na\nb\nc\nd\ne\n"


def test_mpub_json_reports_the_resume_point_on_failure(topic):
    r = run_nsqcli(["mpub", "-t", topic, "--json", "--nsqd-tcp-address", "127.0.0.1:1"], input=b"a\nb\n")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["published"] == 0 and doc["resume_skip"] == 0 and "cannot connect" in doc["error"]


def test_to_file_refuses_a_work_dir_on_another_file_system(tmp_path):
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.stat(shm).st_dev != os.stat(tmp_path).st_dev, \
        "this test needs /dev/shm on another file system than the temp dir"
    work = shm / f"nsqcli-test-{os.getpid()}"
    r = run_nsqcli(["to-file", "-t", "x", "--output-dir", str(tmp_path), "--work-dir", str(work)])
    one_error_line(r, 2, rf"--work-dir {work} and --output-dir {tmp_path} are on different file systems")
    assert not work.exists()


# -- live views --------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 120])
def test_live_tables_fit_the_terminal(sandbox, extra_nsqd, topic, width):
    """Real consumers on two nodes: every line fits, node names keep the port, RDY/in-flight/
    backoff stay, and nothing is truncated to an ellipsis."""
    from rich.console import Console

    from nsqcli.cli.views import connections_table, dashboard
    from nsqcli.client.config import Config
    from nsqcli.client.consumer import Consumer
    from nsqcli.client.stats import compute_rows, poll_nodes

    second = extra_nsqd()
    nodes = [sandbox.nsqd, second]
    for n in nodes:
        http_post(n.http_address, "/mpub", b"a\nb\nc", topic=topic)
    got = []
    consumers = [Consumer(topic, "view", handler=lambda m: got.append(m), config=Config(max_in_flight=50),
                          nsqd_tcp_addresses=[n.tcp_address for n in nodes]).start()]
    try:
        wait_for(lambda: len(got) == 6, what="messages")
        console = Console(record=True, width=width, force_terminal=True, color_system=None)
        console.print(connections_table(consumers, width))
        s1 = poll_nodes([n.http_address for n in nodes], topic, None)
        history = {}
        compute_rows(None, s1, per_node=True, history=history)
        s2 = poll_nodes([n.http_address for n in nodes], topic, None)
        console.print(dashboard(compute_rows(s1, s2, per_node=True, history=history), s2, clients=True, width=width))
        text = console.export_text()
    finally:
        consumers[0].stop()
    lines = text.splitlines()
    assert all(len(ln) <= width for ln in lines), text
    assert "…" not in text, text
    ports = [n.tcp_address.rsplit(":", 1)[1] for n in nodes]
    assert all(f":{p}" in text for p in ports) and "nsqd on 127.0.0.1" in text
    assert "RDY" in text and ("in-flight" in text or "infl" in text) and "backoff" in text
    first_cells = "".join(ln.split("│")[1].strip() for ln in lines if ln.startswith("│"))
    assert f"{topic}/view" in first_cells  # a long topic/channel wraps, it is not cut
    assert "depth" in text and "in/s" in text and "RDY" in text.split("clients")[1]
    if width == 120:
        assert "nsqcli/" in text  # the clients' user agent
        assert "state" in text and "late" in text and "hidden to fit" not in text.split("nsqcli stat")[0]
    else:
        assert "hidden to fit" in text


def test_mpub_progress_bar_ends_at_100_percent(tmp_path):
    from rich.console import Console

    from nsqcli.cli.commands.mpub import Stats, _Progress

    data = tmp_path / "in.txt"
    data.write_bytes(b"x\n" * 1000)

    class App:
        console = Console(record=True, width=100, force_terminal=True, color_system=None)

    stats = Stats()
    with open(data, "rb") as f:
        p = _Progress(App, stats, [f])
        stats.bytes, stats.published = 1000, 1000  # bodies: the delimiters are not counted
        p.update()
        p.finish()
        p.stop()
    assert "100%" in App.console.export_text()


def read_terminal(master: int) -> bytes:
    """Everything the program wrote to the pty (its side is closed: read until EIO/EOF)."""
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk


def test_tail_live_refuses_to_draw_over_its_own_output(nsqd, topic):
    """stdout and stderr on the same terminal: the table would tear the messages - refused
    before connecting; with stdout redirected the table draws on the terminal (stderr)."""
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(NSQCLI + ["tail", topic, "--live", "--nsqd-tcp-address", nsqd.tcp_address],
                             stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=clean_env())
        assert p.wait(timeout=30) == 2
        os.close(slave)
        out = read_terminal(master)
    finally:
        os.close(master)
    assert out.decode().strip() == ("nsqcli: error: --live draws on the terminal that also gets the messages: "
                                    "redirect stdout (nsqcli tail TOPIC --live > FILE) or leave out --live "
                                    "(see 'nsqcli tail --help')")
    assert topic_stats(nsqd, topic) is None  # nothing was subscribed


def test_tail_live_draws_the_table_on_the_terminal(nsqd, topic, tmp_path):
    import pty

    http_post(nsqd.http_address, "/mpub", b"a\nb\nc", topic=topic)
    master, slave = pty.openpty()
    out_file = tmp_path / "bodies"
    try:
        with open(out_file, "wb") as out:
            p = subprocess.Popen(NSQCLI + ["tail", topic, "--live", "--drain-backlog", "-n", "3", "--nsqd-tcp-address",
                                           nsqd.tcp_address], stdin=subprocess.DEVNULL, stdout=out, stderr=slave,
                                 env=clean_env({"COLUMNS": "80", "LINES": "24"}))
            assert p.wait(timeout=30) == 0
        os.close(slave)
        screen = read_terminal(master)
    finally:
        os.close(master)
    assert out_file.read_bytes() == b"a\nb\nc\n"
    text = screen.decode(errors="replace")
    assert "nsqcli connections" in text and "RDY" in text and nsqd.tcp_address.rsplit(":", 1)[1] in text


def test_tail_warns_only_when_a_durable_channel_has_other_consumers(nsqd, topic):
    from nsqcli.client.config import Config
    from nsqcli.client.consumer import Consumer

    env = {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address}
    http_post(nsqd.http_address, "/pub", b"one", topic=topic)
    r = run_nsqcli(["tail", topic, "-c", "mine", "-n", "1"], env)
    assert r.returncode == 0 and r.stdout == b"one\n" and r.stderr == b""
    other = Consumer(topic, "shared", handler=lambda m: None, config=Config(),
                     nsqd_tcp_addresses=[nsqd.tcp_address]).start()
    try:
        wait_for(lambda: http_get_json(nsqd.http_address, "/stats", format="json", topic=topic)["topics"][0]
                 ["channels"][-1]["client_count"] == 1, what="the other consumer")
        r = run_nsqcli(["tail", topic, "-c", "shared", "--timeout", "1s"], env)
    finally:
        other.stop()
    assert r.stderr.decode().splitlines()[0] == (
        f"nsqcli: warning: channel {topic}/shared has 1 other consumer(s): the messages tail shows are FINed here "
        "and never reach them (leave out --channel for a copy of every message)")


# -- signals at start-up, warnings that repeat, whole lines on stderr ---------------------------------
def _block_stop_signals():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def test_a_signal_in_the_first_moments_exits_cleanly(nsqd, topic):
    """SIGTERM/SIGINT at any moment of start-up (0-150 ms: while Python starts, while click and the
    client core are imported, while tail connects): no traceback, a documented exit code. The
    signals are blocked across exec (as a supervisor may leave them), so every delay lands on
    nsqcli's own code whatever the machine's speed: nsqcli installs its handling first thing, then
    unblocks them (before the fix the signals stayed pending and tail ran on)."""
    delays = [0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15]
    for i, delay in enumerate(delays):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
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
