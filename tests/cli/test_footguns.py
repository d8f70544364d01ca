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
