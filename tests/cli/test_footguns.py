"""Footguns: command lines, variables and saved settings that used to mean something other than
what the user meant (or failed late, or with a traceback). Each row is refused before anything
is published or consumed: the exit code, exactly one stderr line naming the problem and the fix,
nothing on stdout, and nsqd's /stats shows no message and no consumer on the row's topic."""

from __future__ import annotations

import re

import pytest
from helpers import run_nsqcli, topic_stats

FILE = __file__  # an existing file


def one_line(r, code: int, pattern: str) -> str:
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    assert r.returncode == code, (r.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nsqcli: error: ") and re.search(pattern, lines[0]), lines[0]
    assert r.stdout == b"", r.stdout
    return lines[0]


def untouched(nsqd, *topics: str) -> None:
    """Nothing published to, nothing subscribed on these topics (nsqd never heard of them)."""
    for t in topics:
        assert topic_stats(nsqd, t) is None, (t, topic_stats(nsqd, t))


def fill(args, nsqd, topic):
    """{tcp}/{http} -> the session nsqd's addresses, {t} -> this row's topic."""
    return [a.format(tcp=nsqd.tcp_address, http=nsqd.http_address, t=topic, file=FILE) for a in args]


# -- 1 + 3: what click would have guessed ---------------------------------------------------------
ARGV = [
    # Go-style single-dash long flags (click read `-topic` as `-t opic`)
    (["tail", "-topic", "{t}", "--nsqd-tcp-address", "{tcp}", "-n", "1", "--timeout", "2s"],
     r"'-topic' is not an option: use --topic \(two dashes"),
    (["pub", "-topic={t}", "x", "--nsqd-tcp-address", "{tcp}"], r"'-topic={t}' is not an option: use --topic={t}"),
    (["pub", "{t}", "x", "-nsqd-tcp-address", "{tcp}"], r"'-nsqd-tcp-address' is not an option: use --nsqd-tcp-addr"),
    (["mpub", "-t", "{t}", "-count", "1", "--nsqd-tcp-address", "{tcp}"], r"use --count"),
    (["to-file", "-topic", "{t}", "--nsqd-tcp-address", "{tcp}"], r"'-topic' is not an option: use --topic"),
    (["stat", "-topic", "{t}"], r"'-topic' is not an option: use --topic"),
    (["context", "add", "x", "-nsqd-tcp-address", "{tcp}"], r"use --nsqd-tcp-address"),
    # a single-valued option twice: the last one won, silently
    (["pub", "-t", "{t}", "-t", "{t}_b", "x", "--nsqd-tcp-address", "{tcp}"],
     r"--topic given twice \(-t '{t}', then -t '{t}_b'\): give it once \(see 'nsqcli pub --help'\)"),
    (["pub", "--topic={t}", "x", "--topic", "{t}_b", "--nsqd-tcp-address", "{tcp}"], r"--topic given twice"),
    (["mpub", "-t{t}", "--topic", "{t}_b", "--nsqd-tcp-address", "{tcp}"], r"--topic given twice"),
    (["tail", "{t}", "-c", "a", "--channel", "b", "--nsqd-tcp-address", "{tcp}", "-n", "1"],
     r"--channel given twice \(-c 'a', then --channel 'b'\)"),
]


@pytest.mark.parametrize("args,pattern", ARGV, ids=[" ".join(a[0])[:50] for a in ARGV])
def test_argv_footgun_is_refused_before_acting(nsqd, topic, args, pattern):
    r = run_nsqcli(fill(args, nsqd, topic), input=b"a\nb\n", timeout=30)
    one_line(r, 2, pattern.replace("{t}", re.escape(topic)))
    untouched(nsqd, topic, topic + "_b", "opic", topic[1:])


ARGV_OK = [  # what still works: clusters, attached values, the same value twice, `--` before data
    ["pub", "-t{t}", "-q", "-v", "x", "--nsqd-tcp-address", "{tcp}"],
    ["pub", "-t", "{t}", "-t", "{t}", "x", "--nsqd-tcp-address", "{tcp}"],
    ["pub", "{t}", "--nsqd-tcp-address", "{tcp}", "--", "-topic"],
]


@pytest.mark.parametrize("args", ARGV_OK, ids=[" ".join(a)[:50] for a in ARGV_OK])
def test_what_looks_alike_still_works(nsqd, topic, args):
    r = run_nsqcli(fill(args, nsqd, topic), timeout=30)
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == 1


# -- 2: addresses with a scheme, comma lists --------------------------------------------------------
ADDRESSES = [
    ({}, ["pub", "{t}", "x", "--nsqd-tcp-address", "tcp://{tcp}"],
     r"'--nsqd-tcp-address': invalid address 'tcp://{tcp}': drop the scheme: {tcp}"),
    ({}, ["tail", "{t}", "--nsqd-tcp-address", "tcp://{tcp}/", "-n", "1"], r"drop the scheme: {tcp}"),
    ({}, ["mpub", "-t", "{t}", "--nsqd-tcp-address", "http://{tcp}"], r"drop the scheme: {tcp}"),
    ({}, ["pub", "{t}", "x", "--lookupd-http-address", "tcp://{http}"],
     r"'--lookupd-http-address': invalid HTTP address 'tcp://{http}': drop the scheme: {http}"),
    ({}, ["stat", "-t", "{t}", "--nsqd-http-address", "tcp://{http}", "-n", "1"], r"drop the scheme: {http}"),
    ({}, ["topic", "create", "{t}", "--nsqd-http-address", "nsqd://{http}"], r"drop the scheme: {http}"),
    ({}, ["to-nsq", "-t", "{t}_src", "--nsqd-tcp-address", "{tcp}", "--destination-nsqd-tcp-address", "tcp://{tcp}",
          "--destination-topic", "{t}"], r"'--destination-nsqd-tcp-address': .*drop the scheme: {tcp}"),
    ({}, ["topic", "create", "{t}", "--nsqd-http-address", "http://{http}/stats"],
     r"a path is not used .*give http://{http}"),
    ({}, ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp},{tcp}"],
     r"'{tcp},{tcp}' is a comma list: give one address per --nsqd-tcp-address "
     r"\(--nsqd-tcp-address {tcp} --nsqd-tcp-address {tcp}\)"),
    ({"NSQCLI_NSQD_TCP_ADDRESS": "{tcp},{tcp}"}, ["pub", "{t}", "x"],
     r"NSQCLI_NSQD_TCP_ADDRESS has a comma list '{tcp},{tcp}': separate several addresses with spaces "
     r"\(NSQCLI_NSQD_TCP_ADDRESS='{tcp} {tcp}'\)"),
    ({"NSQCLI_NSQD_TCP_ADDRESS": "{tcp}, {tcp}"}, ["tail", "{t}", "-n", "1"],
     r"NSQCLI_NSQD_TCP_ADDRESS has a comma list '{tcp}, {tcp}'.*'{tcp} {tcp}'"),
    ({"NSQCLI_LOOKUPD_HTTP_ADDRESS": "127.0.0.1:4161,127.0.0.1:4162"}, ["pub", "{t}", "x"],
     r"NSQCLI_LOOKUPD_HTTP_ADDRESS has a comma list.*separate several addresses with spaces"),
    ({"NSQCLI_NSQD_HTTP_ADDRESS": "{http},{http}"}, ["stat", "-n", "1"], r"NSQCLI_NSQD_HTTP_ADDRESS has a comma list"),
]


@pytest.mark.parametrize("env,args,pattern", ADDRESSES, ids=[" ".join(a[1])[:50] for a in ADDRESSES])
def test_address_footgun_is_refused_naming_the_fix(nsqd, topic, env, args, pattern):
    env = {k: v.format(tcp=nsqd.tcp_address, http=nsqd.http_address) for k, v in env.items()}
    r = run_nsqcli(fill(args, nsqd, topic), env, input=b"a\n", timeout=30)
    one_line(r, 2, pattern.format(t=re.escape(topic), tcp=re.escape(nsqd.tcp_address),
                                  http=re.escape(nsqd.http_address)))
    untouched(nsqd, topic, topic + "_src")


def test_http_urls_stay_accepted(nsqd, topic):
    """http(s):// is documented for HTTP addresses (https is the only way to reach a lookupd
    behind TLS): only a path, which would be dropped, is refused."""
    r = run_nsqcli(["topic", "create", topic, "--nsqd-http-address", f"http://{nsqd.http_address}/"])
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, topic) is not None


# -- 4 + 5: to-file refuses a file name or a directory it cannot use, before it subscribes ----------
TO_FILE = [
    (["--filename-format", "../x/<TOPIC>.log"], r"--filename-format '\.\./x/<TOPIC>\.log' leaves --output-dir: "
                                                r"give a path inside it \(no leading '/', no '\.\.'\)"),
    (["--filename-format", "{tmp}_abs/<TOPIC>.log"], r"--filename-format '/.*_abs/<TOPIC>\.log' leaves --output-dir"),
    (["--filename-format", "a/../../<TOPIC>.<REV>.log", "--gzip"], r"leaves --output-dir"),
    (["--output-dir", "/sys/kernel"], r"'--output-dir': cannot write files in '/sys/kernel' \(Permission denied\)"),
    (["--output-dir", "{file}/sub"], r"'--output-dir': cannot write files in '.*/sub' \(Not a directory\)"),
    (["--output-dir", "{tmp}", "--work-dir", "/sys/kernel/work"], r"'--work-dir': cannot write files in "
                                                                  r"'/sys/kernel/work' \(Operation not permitted\)"),
    (["--output-dir", "{tmp}", "--work-dir", "{file}/work"], r"'--work-dir': cannot write files in .*Not a directory"),
]


@pytest.mark.parametrize("extra,pattern", TO_FILE, ids=[" ".join(a[0])[:50] for a in TO_FILE])
def test_to_file_refuses_what_it_cannot_write_before_subscribing(nsqd, topic, tmp_path, extra, pattern):
    run_nsqcli(["pub", topic, "kept", "--nsqd-tcp-address", nsqd.tcp_address]).check_returncode()
    args = ["to-file", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address]
    args += [] if "--output-dir" in extra else ["--output-dir", str(tmp_path / "out")]
    args += [a.format(file=FILE, tmp=str(tmp_path / "out")) for a in extra]
    one_line(run_nsqcli(args, timeout=30), 2, pattern)
    t = topic_stats(nsqd, topic)
    assert t["channels"] == [] and t["depth"] == 1  # never subscribed: the message is still there
    assert not any(tmp_path.rglob("*.log"))


# -- 6: contexts ------------------------------------------------------------------------------------
def _files(cfg, files: dict) -> None:
    for rel, text in files.items():
        (cfg / rel).parent.mkdir(parents=True, exist_ok=True)
        (cfg / rel).write_text(text)


CONTEXTS = [  # (files in the config dir, env, args, pattern)
    ({"contexts/bad.toml": "nsqd-tcp-address = 42150\n"}, {}, ["pub", "{t}", "x", "--context", "bad"],
     r"'--context': .*/contexts/bad\.toml: context 'bad': nsqd-tcp-address = 42150 is not valid: "
     r"use \[\"127\.0\.0\.1:4150\"\] \(a list of strings\)"),
    ({"contexts/bad.toml": 'tls = "yes"\n'}, {"NSQCLI_CONTEXT": "bad"}, ["tail", "{t}", "-n", "1"],
     r"bad\.toml: context 'bad': tls = \"yes\" is not valid: use true or false"),
    ({"contexts/bad.toml": "deflate-level = \"9\"\n", "config.toml": 'context = "bad"\n'}, {},
     ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"], r"context 'bad': deflate-level = \"9\" is not valid: use a whole"),
    ({"contexts/bad.toml": "nsqd-tcp-address = [1]\n"}, {}, ["context", "show", "bad"],
     r"context 'bad': nsqd-tcp-address = \[1\] is not valid"),
    ({"config.toml": 'context = "gone"\n', "contexts/other.toml": "tls = true\n"}, {},
     ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"],
     r"the selected context 'gone' \(.*config\.toml\) no longer exists; select another \('nsqcli context select NAME'\)"),
    ({}, {"NSQCLI_CONTEXT": "gone"}, ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"], r"no context named 'gone'"),
    ({}, {"NSQCLI_CONFIG_DIR": "{file}"}, ["pub", "{t}", "x", "--nsqd-tcp-address", "{tcp}"],
     r"NSQCLI_CONFIG_DIR=.*test_footguns\.py is not a directory"),
    ({}, {"NSQCLI_CONFIG_DIR": "{file}"}, ["context", "ls"], r"NSQCLI_CONFIG_DIR=.* is not a directory"),
    ({}, {"NSQCLI_CONFIG_DIR": "{file}"}, ["context", "add", "x", "--nsqd-tcp-address", "{tcp}"],
     r"NSQCLI_CONFIG_DIR=.* is not a directory"),
]


@pytest.mark.parametrize("files,env,args,pattern", CONTEXTS, ids=[" ".join(c[2])[:50] for c in CONTEXTS])
def test_a_context_that_cannot_be_used_is_one_usage_line(nsqd, topic, tmp_path, files, env, args, pattern):
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    _files(cfg, files)
    env = {"NSQCLI_CONFIG_DIR": str(cfg), **{k: v.format(file=FILE) for k, v in env.items()}}
    one_line(run_nsqcli(fill(args, nsqd, topic), env, input=b"", timeout=30), 2, pattern)
    untouched(nsqd, topic)


def test_a_sandbox_context_is_stale_once_the_sandbox_is_gone(nsqd, topic, tmp_path):
    import json
    import os
    import signal

    from helpers import wait_for

    env = {"NSQCLI_CONFIG_DIR": str(tmp_path / "cfg")}
    if os.environ.get("NSQCLI_NSQ_BIN"):  # where the session's nsqd came from
        env["NSQCLI_NSQ_BIN"] = os.environ["NSQCLI_NSQ_BIN"]
    r = run_nsqcli(["sandbox", "--detach", "--no-lookupd", "--save-context", "dev"], env, timeout=60)
    assert r.returncode == 0, r.stderr
    pid = int(re.search(rb"NSQCLI_SANDBOX_PID=(\d+)", r.stdout).group(1))
    try:
        assert b"stale" not in run_nsqcli(["context", "ls"], env).stdout
        assert run_nsqcli(["pub", topic, "x", "--context", "dev"], env).returncode == 0
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: b"stale" in run_nsqcli(["context", "ls"], env).stdout, what="the context is stale")
    assert run_nsqcli(["context", "ls"], env).stdout.decode() == (
        f"  dev  {json.loads(run_nsqcli(['context', 'ls', '--json'], env).stdout)[0]['description']}  "
        f"(stale: the sandbox that saved it is gone (pid {pid}))\n")
    one_line(run_nsqcli(["pub", topic, "y", "--context", "dev", "--nsqd-tcp-address", nsqd.tcp_address], env), 2,
             rf"the sandbox that saved context 'dev' is gone \(pid {pid}\); start it again or 'nsqcli context rm dev'")
    assert topic_stats(nsqd, topic) is None  # the first pub went to the sandbox's nsqd, the second nowhere
    assert run_nsqcli(["context", "rm", "dev"], env).returncode == 0


# -- 7: a TCP port where an HTTP port is meant, or the other server's HTTP port ---------------------
PORTS = [  # {tcp}/{http}: the nsqd's ports, {lhttp}: nsqlookupd's HTTP port
    (["stat", "-n", "1", "--no-live", "--nsqd-http-address", "{tcp}"],
     r"no nsqd answered /stats: {tcp} \(this port speaks TCP, not HTTP: give nsqd's HTTP port, usually 4151\)"),
    (["stat", "-n", "1", "--no-live", "--nsqd-http-address", "{lhttp}"],
     r"\(it answered 404 like nsqlookupd HTTP port: give nsqd's HTTP port, usually 4151\)"),
    (["stat", "-n", "1", "--no-live", "--lookupd-http-address", "{tcp}"],
     r"no nsqlookupd answered \({tcp}\) \(this port speaks TCP, not HTTP: give nsqlookupd's HTTP port, usually 4161\)"),
    (["stat", "-n", "1", "--no-live", "--lookupd-http-address", "{http}"],
     r"\(it answered 404 like an nsqd HTTP port: give nsqlookupd's HTTP port, usually 4161\)"),
    (["lookup", "--lookupd-http-address", "{tcp}"],
     r"no nsqlookupd answered \({tcp}\) \(this port speaks TCP, not HTTP: give nsqlookupd's HTTP port"),
    (["lookup", "--lookupd-http-address", "{http}"], r"\(it answered 404 like an nsqd HTTP port: give nsqlookupd's"),
    (["topic", "create", "{t}", "--nsqd-http-address", "{tcp}"],
     r"create failed on 1 of 1 node\(s\): .*\(this port speaks TCP, not HTTP: give nsqd's HTTP port, usually 4151\)"),
    (["channel", "create", "{t}", "c", "--lookupd-http-address", "{tcp}"],
     r"no nsqlookupd answered .*\(this port speaks TCP, not HTTP: give nsqlookupd's HTTP port, usually 4161\)"),
    (["topic", "delete", "{t}", "--yes", "--lookupd-http-address", "{http}"],
     r"no nsqlookupd answered .*HTTP 404.* \(it answered 404 like an nsqd HTTP port: give nsqlookupd's HTTP port"),
    (["node", "tombstone", "{t}", "{tcp}", "--yes", "--lookupd-http-address", "{tcp}"],
     r"this port speaks TCP, not HTTP: give nsqlookupd's HTTP port"),
]


@pytest.mark.parametrize("args,pattern", PORTS, ids=[" ".join(a[0])[:50] for a in PORTS])
def test_a_port_mix_up_gets_the_hint(nsqd, lookupd, topic, args, pattern):
    args = [a.format(tcp=nsqd.tcp_address, http=nsqd.http_address, lhttp=lookupd.http_address, t=topic) for a in args]
    r = run_nsqcli(args, timeout=30)
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err, (r.returncode, err)
    errors = [ln for ln in err.splitlines() if not ln.startswith("nsqcli: warning: ")]
    assert len(errors) == 1 and errors[0].startswith("nsqcli: error: "), err
    assert re.search(pattern.format(tcp=re.escape(nsqd.tcp_address)), errors[0]), errors[0]
    untouched(nsqd, topic)


# -- 8: a topic that exists nowhere, a pattern that matches nothing yet, a closed stdout ------------
def test_stat_of_a_topic_that_exists_nowhere_says_so(nsqd, lookupd, topic):
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--no-live", "--nsqd-http-address", nsqd.http_address])
    one_line(r, 1, rf"topic '{topic}' exists on no nsqd \(asked {re.escape(nsqd.http_address)}\)")
    r = run_nsqcli(["stat", "-t", topic, "-n", "1", "--json", "--lookupd-http-address", lookupd.http_address])
    one_line(r, 1, rf"topic '{topic}' is unknown to nsqlookupd {re.escape(lookupd.http_address)}")
    untouched(nsqd, topic)


def test_to_file_says_once_what_a_pattern_waits_for(nsqd, lookupd, topic, tmp_path):
    import signal
    import subprocess
    import time

    from helpers import NSQCLI, clean_env, http_post, wait_for

    proc = subprocess.Popen(NSQCLI + ["to-file", "--topic-pattern", f"^{topic}$", "--lookupd-http-address",
                                      lookupd.http_address, "--topic-refresh", "0.5s", "--output-dir", str(tmp_path),
                                      "--sync-interval", "0.2s", "--no-live"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    try:
        time.sleep(2.5)  # several refreshes: said once, not at each
        http_post(nsqd.http_address, "/pub", b"late", topic=topic)
        wait_for(lambda: list(tmp_path.rglob(f"{topic}*")), timeout=20, what="the topic archived")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == b"", err
    waiting = [ln for ln in err.decode().splitlines() if "waiting for a topic" in ln]
    assert len(waiting) == 1 and waiting[0].endswith(
        f"INFO: waiting for a topic matching '^{topic}$': nsqlookupd {lookupd.http_address} knows none with a "
        "producer yet (asked every 0.5s)"), err


CLOSED_STDOUT = [
    ["pub", "{t}", "kept", "--json", "--nsqd-tcp-address", "{tcp}"],
    ["mpub", "-t", "{t}", "--json", "--nsqd-tcp-address", "{tcp}"],
    ["tail", "{t}", "-n", "1", "--drain-backlog", "--nsqd-tcp-address", "{tcp}"],
    ["lookup"], ["lookup", "--json"], ["lookup", "--nodes"],
    ["stat", "-n", "1", "--no-live"], ["stat", "-n", "1", "--json"],
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

    from helpers import NSQCLI, clean_env, http_post

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
