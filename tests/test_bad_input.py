"""Every bad input a user tried (issue 12's table): one line on stderr naming the problem, the
documented exit code (2 usage, 1 runtime), nothing on stdout, never a traceback - and nothing
is started before the input is known to be good (no server is needed for the usage errors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import run_nsqcli

FILE = str(Path(__file__).resolve())  # an existing file
DEAD = "127.0.0.1:1"                  # nothing listens there

CASES = [
    # -- pub --
    (["pub"], 2, r"missing TOPIC \(nsqcli pub TOPIC \[MESSAGE\], or -t TOPIC\)"),
    (["pub", "bad topic!", "x"], 2, r"invalid topic name 'bad topic!'"),
    (["pub", "-t", "t", "a", "b"], 2, r"too many arguments: 'a b' \(quote a MESSAGE with spaces"),
    (["pub", "t", ""], 2, r"the message is empty \(nsqd rejects empty messages\)"),
    (["pub", "t", "x", "--timeout", "0"], 2, r"Invalid value for '--timeout': must be more than 0"),
    (["pub", "t", "x", "--timeout", "soon"], 2, r"'soon' is not a duration \(use e\.g\. 500ms, 2s, 1m, 1h30m\)"),
    (["pub", "t", "x", "--defer", "-1s"], 2, r"'-1s' is not a duration"),
    (["pub", "t", "x", "--nsqd-tcp-address", "localhost"], 2, r"invalid address 'localhost': expected HOST:PORT"),
    (["pub", "t", "x", "--nsqd-tcp-address", "h:99999"], 2, r"invalid address 'h:99999': expected HOST:PORT"),
    (["pub", "t", "x", "--lookupd-http-address", "ftp://h:1"], 2, r"invalid HTTP address 'ftp://h:1'"),
    (["pub", "t", "x", "--lookupd-http-address", "h"], 2, r"'--lookupd-http-address': invalid address 'h'"),
    (["pub", "t", "x", "--snappy", "--deflate"], 2, r"--snappy and --deflate cannot be used together"),
    (["pub", "t", "x", "--tls-cert", "/nonexistent"], 2, r"'--tls-cert': File '/nonexistent' does not exist"),
    (["pub", "t", "x", "--tls-cert", FILE], 2, r"--tls-cert and --tls-key go together"),
    (["pub", "t", "x", "--deflate-level", "10"], 2, r"'--deflate-level': 10 is not in the range 1<=x<=9"),
    (["pub", "t", "x", "--tls-min-version", "1.4"], 2, r"'--tls-min-version': '1\.4' is not one of"),
    (["pub", "t", "x", "--nsqd-tcp-address", DEAD], 1, r"127\.0\.0\.1:1: cannot connect: Connection refused"),
    (["pub", "t", "x", "--lookupd-http-address", DEAD], 1, r"no nsqlookupd answered \(http://127\.0\.0\.1:1/lookup"),
    (["pub", "t", "x", "--context", "nope"], 2, r"'--context': no context named 'nope' \(none saved yet"),
    (["pub", "t", "x", "--bogus"], 2, r"No such option '--bogus'"),
    (["pub", "t", "x", "--heartbeat-interval", "abc"], 2, r"'abc' is not a duration"),
    (["pub", "t", "x", "--auth-secret-file", "/nonexistent"], 2, r"'--auth-secret-file': File '/nonexistent' does not"),
    (["pub", "t", "x", "--msg-timeout", "x"], 2, r"'--msg-timeout': 'x' is not a duration"),
    (["pub", "a" * 65, "x"], 2, r"invalid topic name 'a{65}'.*64"),
    (["pub", "t#ephemeral#x", "x"], 2, r"invalid topic name 't#ephemeral#x'"),
    (["pub", "-topic", "t", "x"], 2, r"'-topic' is not an option: use --topic \(two dashes"),
    (["pub", "-t", "a", "-t", "b", "x"], 2, r"--topic given twice \(-t 'a', then -t 'b'\): give it once"),
    (["pub", "t", "x", "--nsqd-tcp-address", "tcp://h:1"], 2, r"invalid address 'tcp://h:1': drop the scheme: h:1"),
    (["pub", "t", "x", "--nsqd-tcp-address", "a:1,b:1"], 2, r"'a:1,b:1' is a comma list: give one address per"),
    # -- mpub --
    (["mpub"], 2, r"missing TOPIC \(nsqcli mpub TOPIC \[FILE\]\.\.\., or -t TOPIC\)"),
    (["mpub", "-t", "t", "/nonexistent"], 2, r"Invalid value for FILE: '/nonexistent': No such file or directory"),
    (["mpub", "-t", "t", "-0", "-d", ","], 2, r"-0/--null and -d/--delimiter cannot be used together"),
    (["mpub", "-t", "t", "-d", "ab"], 2, r"delimiter must be exactly one byte .* got 'ab'"),
    (["mpub", "-t", "t", "-f", "xml"], 2, r"'-f' / '--format': 'xml' is not one of 'raw', 'json'"),
    (["mpub", "-t", "t", "--batch-size", "0"], 2, r"'--batch-size': 0 is not in the range 1<=x<=100000"),
    (["mpub", "-t", "t", "--rate", "0"], 2, r"'--rate': 0\.0 is not in the range x>0"),
    (["mpub", "-t", "t", "--skip", "-1"], 2, r"'--skip': -1 is not in the range x>=0"),
    (["mpub", "-t", "t", "-n", "0"], 2, r"'-n' / '--count': 0 is not in the range x>=1"),
    (["mpub", "-t", "t", "--max-msg-size", "0"], 2, r"'--max-msg-size': 0 is not in the range x>=1"),
    (["mpub", "-t", "t", "--nsqd-tcp-address", DEAD], 1, r"cannot connect: Connection refused; nsqd acknowledged "
                                                          r"0 records in this run; resume with --skip 0"),
    # -- tail --
    (["pub", "t", "x", "--auth-secret", ""], 2, r"'--auth-secret': is empty: give the secret"),
    # -- wait, check, exec --
    (["wait"], 2, r"nothing to wait for: give --ready, --exists, --drained or --depth-below"),
    (["wait", "--drained"], 2, r"--drained needs a TOPIC \(nsqcli wait TOPIC \[CHANNEL\] --drained"),
    (["wait", "t", "c", "--depth-below", "-1"], 2, r"'--depth-below': -1 is not in the range x>=1"),
    (["wait", "--ready", "--interval", "0"], 2, r"'--interval': must be more than 0"),
    (["wait", "--ready", "--timeout", "0"], 2, r"'--timeout': must be more than 0 \(there is no endless wait"),
    (["wait", "--ready", "--nsqd-http-address", DEAD, "--timeout", "1s"], 3,
     r"--timeout \(1s\) passed; not met: nsqd 127\.0\.0\.1:1 not ready"),
    (["check", "t", "c", "--depth-warn", "10", "--depth-crit", "5"], 2, r"--depth-warn 10 is above --depth-crit 5"),
    (["check", "t", "c", "--format", "xml"], 2, r"'--format': 'xml' is not one of 'nagios'"),
    (["check", "t", "c", "--timeout", "0"], 2, r"'--timeout': must be more than 0 \(leave it out for no deadline\)"),
    (["exec", "t", "-c", "c"], 2, r"missing COMMAND \(nsqcli exec \[TOPIC\] -- COMMAND \[ARG\]\.\.\.\)"),
    (["exec", "t", "-c", "c", "sh", "-c", "x"], 2, r"--channel given twice \(-c 'c', then -c 'x'\)"),
    (["exec", "t", "--", "true"], 2, r"missing CHANNEL"),
    (["exec", "t", "-c", "c", "--concurrency", "0", "--", "true"], 2, r"'--concurrency': 0 is not in the range"),
    (["exec", "t", "-c", "c", "--", "/nonexistent/x"], 2, r"'/nonexistent/x' is not an executable file"),
    (["exec", "t", "-c", "c", "--", "nosuchcmd_zz"], 2, r"command not found: 'nosuchcmd_zz' \(not in PATH\)"),
    (["exec", "t", "-c", "c", "--command-timeout", "0", "--", "true"], 2, r"'--command-timeout': must be more"),
    (["exec", "t", "-c", "c", "--max-attempts", "2", "--dead-letter-topic", "t", "--", "true"], 2,
     r"--dead-letter-topic t is the topic being consumed"),
    (["exec", "t", "-c", "c", "--dead-letter-topic", "d", "--", "true"], 2, r"--dead-letter-topic needs --max-attempts"),
    (["exec", "t", "-c", "c", "--nsqd-tcp-address", DEAD, "--", "true"], 1, r"127\.0\.0\.1:1: cannot connect"),
    (["tail"], 2, r"missing TOPIC \(nsqcli tail TOPIC\.\.\., or -t TOPIC\)"),
    (["tail", "t", "-f", "xml"], 2, r"unknown --format 'xml': use raw, json or a template with \{fields\}"),
    (["tail", "t", "-f", "JSON"], 2, r"unknown --format 'JSON': use raw, json \(lower case\)"),
    (["tail", "t", "-f", "{nope}"], 2, r"invalid --format template '\{nope\}': unknown field 'nope'"),
    (["tail", "t", "-f", "{"], 2, r"invalid --format template '\{'"),
    (["tail", "t", "--timeout", "0"], 2, r"'--timeout': must be more than 0 \(leave it out for no deadline\)"),
    (["tail", "t", "--idle-timeout", "0"], 2, r"'--idle-timeout': must be more than 0"),
    (["tail", "t", "-n", "-1"], 2, r"'-n' / '--count': -1 is not in the range x>=0"),
    (["tail", "t", "--max-in-flight", "0"], 2, r"'--max-in-flight': 0 is not in the range 1<=x<=100000"),
    (["tail", "t", "-c", "bad channel"], 2, r"invalid channel name 'bad channel'"),
    (["tail", "t", "--print-topic", "-f", "json"], 2, r"--print-topic goes with --format raw"),
    (["tail", "t", "--sample-rate", "100"], 2, r"'--sample-rate': 100 is not in the range 0<=x<=99"),
    (["tail", "t", "--lookupd-http-address", "127.0.0.1"], 2, r"invalid address '127\.0\.0\.1': expected HOST:PORT"),
    (["tail", "t", "--nsqd-tcp-address", DEAD, "--drain-backlog"], 1, r"127\.0\.0\.1:1: cannot connect"),
    (["tail", "t", "--lookupd-http-address", DEAD], 1, r"http://127\.0\.0\.1:1/lookup.*unreachable"),
    (["tail", "t", "--lookupd-poll-interval", "x"], 2, r"'--lookupd-poll-interval': 'x' is not a duration"),
    (["tail", "t", "--nsqd-http-address", "x"], 2, r"'--nsqd-http-address': invalid address 'x'"),
    (["tail", "bad topic"], 2, r"invalid topic name 'bad topic'"),
    # -- to-file --
    (["to-file"], 2, r"give --topic or --topic-pattern"),
    (["to-file", "-t", "t", "--topic-pattern", "x"], 2, r"--topic and --topic-pattern cannot be used together"),
    (["to-file", "--topic-pattern", "x"], 2, r"--topic-pattern needs --lookupd-http-address"),
    (["to-file", "--topic-pattern", "(", "--lookupd-http-address", DEAD], 2, r"invalid --topic-pattern '\('"),
    (["to-file", "-t", "t", "--gzip-level", "5"], 2, r"--gzip-level needs --gzip"),
    (["to-file", "-t", "t", "--gzip", "--gzip-level", "10"], 2, r"'--gzip-level': 10 is not in the range 1<=x<=9"),
    (["to-file", "-t", "t", "--rotate-size", "10X"], 2, r"'10X' is not a size \(use e\.g\. 100M, 512K"),
    (["to-file", "-t", "t", "--filename-format", "x.log"], 2, r"--filename-format needs <TOPIC>"),
    (["to-file", "-t", "t", "--gzip", "--filename-format", "<TOPIC>.log"], 2, r"--filename-format needs <REV>"),
    (["to-file", "-t", "t", "-f", "xml"], 2, r"'-f' / '--format': 'xml' is not one of"),
    (["to-file", "-t", "t", "--log-level", "loud"], 2, r"'--log-level': 'loud' is not one of"),
    (["to-file", "-t", "t", "--sync-interval", "x"], 2, r"'--sync-interval': 'x' is not a duration"),
    (["to-file", "-t", "t", "--sync-interval", "0"], 2, r"'--sync-interval': must be more than 0"),
    (["to-file", "-t", "t", "--filename-format", "../<TOPIC>.log"], 2, r"'\.\./<TOPIC>\.log' leaves --output-dir"),
    (["to-file", "-t", "t", "--output-dir", FILE + "/sub"], 2, r"'--output-dir': cannot write files in"),
    (["to-file", "-t", "t", "--output-dir", FILE], 2, r"'--output-dir': Directory '.*' is a file"),
    # -- lookup --
    (["lookup", "--lookupd-http-address", DEAD], 1, r"no nsqlookupd answered \(127\.0\.0\.1:1\)"),
    (["lookup", "-t", "t", "--nodes"], 2, r"--topic and --nodes cannot be used together"),
    (["lookup", "a", "-t", "b"], 2, r"TOPIC given twice: 'a' as an argument and 'b' with -t \(give it once\)"),
    (["lookup", "bad topic"], 2, r"invalid topic name 'bad topic'"),
    # -- stat --
    (["stat", "-c", "x"], 2, r"--channel needs --topic"),
    (["stat", "--interval", "x"], 2, r"'--interval': 'x' is not a duration"),
    (["stat", "--interval", "0"], 2, r"'--interval': must be more than 0"),
    (["stat", "-n", "0"], 2, r"'-n' / '--count': 0 is not in the range x>=1"),
    (["stat", "--nsqd-http-address", ":"], 2, r"'--nsqd-http-address': invalid address ':'"),
    (["stat", "--nsqd-http-address", DEAD, "-n", "1", "--no-live"], 1, r"no nsqd answered /stats: 127\.0\.0\.1:1"),
    (["stat", "--json", "--live"], 2, r"--json and --live cannot be used together"),
    # -- sandbox --
    (["sandbox", "--nodes", "0"], 2, r"'--nodes': 0 is not in the range 1<=x<=16"),
    (["sandbox", "--tls-cert", FILE], 2, r"--tls-cert and --tls-key go together"),
    (["sandbox", "--save-context", "bad name!"], 2, r"context name 'bad name!' must be 1-64 letters"),
    (["sandbox", "--install", "--detach"], 2, r"--install builds NSQ and exits: it takes no other option"),
    # -- context --
    (["context", "add", "bad name!", "--nsqd-tcp-address", "h:1"], 2, r"context name 'bad name!' must be"),
    (["context", "add", "x"], 2, r"give at least one --nsqd-tcp-address, --nsqd-http-address or"),
    (["context", "add", "x", "--nsqd-tcp-address", "nope"], 2, r"invalid address 'nope': expected HOST:PORT"),
    (["context", "show", "nope"], 2, r"no context named 'nope'"),
    (["context", "show"], 2, r"no context selected; name one"),
    (["context", "select"], 2, r"give a context NAME or --none"),
    (["context", "select", "nope"], 2, r"no context named 'nope'"),
    (["context", "rm", "nope"], 2, r"no context named 'nope'"),
    (["context", "frob"], 2, r"No such command 'frob'"),
    # -- doctor --
    (["doctor", "-t", "bad topic"], 2, r"invalid topic name 'bad topic'"),
    (["doctor", "--nsqd-tcp-address", "x"], 2, r"invalid address 'x': expected HOST:PORT"),
    # -- completion, man, version, root --
    (["completion"], 2, r"Missing argument .SHELL.\. Choose from: bash, zsh, fish"),
    (["completion", "tcsh"], 2, r"'tcsh' is not one of 'bash', 'zsh', 'fish'"),
    (["man", "nope"], 2, r"no manual page for 'nope' \(commands: "),
    (["version", "--bogus"], 2, r"No such option '--bogus'"),
    (["frob"], 2, r"No such command 'frob'"),
    (["--context"], 2, r"Option '--context' requires an argument"),
    (["-x"], 2, r"No such option '-x'"),
    # -- to-nsq, to-http, admin, bench --
    (["to-nsq", "-t", "t"], 2, r"give --destination-nsqd-tcp-address or --destination-lookupd-http-address"),
    (["to-nsq", "-t", "t", "--destination-nsqd-tcp-address", "h:1", "--require-json-value", "v"], 2,
     r"--require-json-value needs --require-json-field"),
    (["to-nsq", "-t", "t", "--destination-nsqd-tcp-address", "x"], 2, r"invalid address 'x': expected HOST:PORT"),
    (["to-nsq", "-t", "t", "--destination-nsqd-tcp-address", "h:1", "--mode", "random"], 2, r"'random' is not one of"),
    (["to-http", "-t", "t"], 2, r"give --post URL or --get URL \(not both\)"),
    (["to-http", "-t", "t", "--get", "http://h/x"], 2, r"a --get URL needs exactly one %s"),
    (["to-http", "-t", "t", "--post", "http://h/", "--sample", "0"], 2, r"'--sample': 0\.0 is not in the range"),
    (["to-http", "-t", "t", "--post", "http://h/", "--http-timeout", "0"], 2, r"'--http-timeout': must be more than 0"),
    (["to-http", "-t", "t", "--post", "http://h/", "--header", "X-Name: 日本"], 2, r"HTTP headers are latin-1"),
    (["to-http", "-t", "t", "--post", "http://h/€"], 2, r"percent-encode what is not ASCII"),
    (["topic", "delete", "t", "--nsqd-http-address", DEAD], 2, r"delete is destructive: add --yes"),
    (["topic", "frob", "t"], 2, r"No such command 'frob'"),
    (["channel", "create", "t"], 2, r"missing CHANNEL \(nsqcli channel create TOPIC \[CHANNEL\], or -c CHANNEL\)"),
    (["node", "tombstone", "t", "h:1"], 2, r"tombstoning is done in nsqlookupd: give --lookupd-http-address"),
    (["bench", "pub", "--size", "4"], 2, r"'--size': 4 is not in the range 8<=x<=1048576"),
    (["bench", "pub", "-n", "5", "--duration", "1s"], 2, r"give --count or --duration, not both"),
    (["bench", "pub", "-n", "5", "--nsqd-tcp-address", DEAD], 1, r"1 bench client\(s\) failed: .*Connection refused"),
    # -- Spark commands: refused before Spark starts --
    (["replay"], 2, r"missing TOPIC \(nsqcli replay TOPIC ARCHIVE\.\.\., or -t TOPIC\)"),
    (["replay", "/nonexistent", "-t", "t"], 2, r"/nonexistent"),
    (["replay", FILE, "-t", "t", "--since", "2h", "--until", "3h"], 2, r"--since must be before --until"),
    (["replay", FILE, "-t", "t", "--since", "yesterday"], 2, r"'yesterday' is not a time"),
    (["replay", FILE, "-t", "t", "--conf", "novalue"], 2, r"--conf"),
    (["query", "select 1"], 2, r"Missing option '-a' / '--archive'"),
    (["query", "select 1", "-a", FILE, "--json", "--csv"], 2, r"--json.*--csv"),
    (["to-parquet", "-t", "t", "-o", "/tmp/x"], 2, r"Missing option '--checkpoint'"),
]

ENV_CASES = [
    ({"NSQCLI_NSQD_TCP_ADDRESS": "nope"}, ["pub", "t", "x"], 2, r"invalid address 'nope': expected HOST:PORT"),
    ({"NSQCLI_TLS_MIN_VERSION": "9"}, ["pub", "t", "x"], 2, r"'9' is not one of"),
    ({"NSQCLI_CONTEXT": "nope"}, ["pub", "t", "x"], 2, r"no context named 'nope'"),
    ({"NSQCLI_SAMPLE_RATE": "-5"}, ["tail", "t"], 2, r"-5 is not in the range 0<=x<=99"),
    ({"NSQCLI_LOOKUPD_HTTP_ADDRESS": "a:4161,b:4161"}, ["tail", "t"], 2,
     r"NSQCLI_LOOKUPD_HTTP_ADDRESS has a comma list 'a:4161,b:4161': separate several addresses with spaces"),
    ({"NSQCLI_CONFIG_DIR": FILE}, ["pub", "t", "x"], 2, r"NSQCLI_CONFIG_DIR=.* is not a directory"),
]


def _check(r, code: int, pattern: str) -> None:
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    assert r.returncode == code, (r.returncode, err)
    lines = [ln for ln in err.splitlines() if not ln.startswith("nsqcli: warning: ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("nsqcli: error: ") and re.search(pattern, lines[0]), lines[0]
    assert r.stdout == b"", r.stdout


@pytest.mark.parametrize("args,code,pattern", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input(args, code, pattern):
    _check(run_nsqcli(args, input=b"a\n", timeout=60), code, pattern)


@pytest.mark.parametrize("env,args,code,pattern", ENV_CASES, ids=[next(iter(c[0])) for c in ENV_CASES])
def test_bad_environment(env, args, code, pattern):
    _check(run_nsqcli(args, env, input=b"", timeout=60), code, pattern)


def test_the_table_is_the_issue_s_size():
    assert len(CASES) + len(ENV_CASES) >= 109
