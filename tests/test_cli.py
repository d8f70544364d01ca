"""The real `nsqcli` executable against real nsqd: stdout bytes, stderr lines, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import NSQCLI, channel_stats, clean_env, http_get_json, http_post, topic_stats, wait_for
from helpers import run_nsqcli as run


@pytest.fixture
def env(sandbox):
    return {"NSQCLI_NSQD_TCP_ADDRESS": sandbox.nsqd.tcp_address}


def test_version_and_help():
    r = run(["--version"])
    assert r.returncode == 0 and r.stdout.startswith(b"nsqcli, version ")
    r = run(["pub", "--help"])
    assert b"NSQCLI_NSQD_TCP_ADDRESS" in r.stdout and b"127.0.0.1:4150" in r.stdout


def test_pub_argument_and_stdin(nsqd, env, topic):
    assert run(["pub", "-t", topic, "hello"], env).returncode == 0
    binary = bytes(range(256)) * 3
    r = run(["pub", "-t", topic], env, input=binary)
    assert r.returncode == 0 and r.stdout == b"" and r.stderr == b""
    assert topic_stats(nsqd, topic)["message_count"] == 2
    r = run(["tail", "-t", topic, "-n", "2", "--format", "json", "-c", "c"], env)
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert recs[0]["body"] == "hello"
    import base64
    assert base64.b64decode(recs[1]["body_base64"]) == binary


def test_pub_errors_are_one_line_with_exit_codes(env, topic):
    r = run(["pub", "-t", "bad topic", "x"], env)
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"invalid topic name 'bad topic'" in r.stderr
    r = run(["pub", "-t", topic, "--nsqd-tcp-address", "127.0.0.1:1", "x"])
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1
    assert b"127.0.0.1:1: cannot connect: Connection refused" in r.stderr and b"Traceback" not in r.stderr
    r = run(["pub", "-t", topic], env, input=b"")
    assert r.returncode == 2 and b"empty" in r.stderr
    r = run(["pub", "-t", topic, "--defer", "soon", "x"], env)
    assert r.returncode == 2 and b"not a duration" in r.stderr


def test_pub_fanout_and_lookupd(sandbox, nsqd, extra_nsqd, lookupd, topic):
    other = extra_nsqd()
    r = run(["pub", "-t", topic, "--fanout", "--nsqd-tcp-address", nsqd.tcp_address,
             "--nsqd-tcp-address", other.tcp_address, "both"])
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == 1 and topic_stats(other, topic)["message_count"] == 1
    wait_for(lambda: http_get_json(lookupd.http_address, "/lookup", topic=topic)["producers"], what="registered")
    r = run(["pub", "-t", topic, "--lookupd-http-address", lookupd.http_address, "via-lookupd"])
    assert r.returncode == 0, r.stderr
    r = run(["pub", "-t", topic + "_unknown", "--lookupd-http-address", lookupd.http_address, "x"])
    assert r.returncode == 1 and b"no nsqd carries topic" in r.stderr


def test_mpub_records_delimiters_and_summary(nsqd, env, topic):
    r = run(["mpub", "-t", topic], env, input=b"one\ntwo\n\nthree")
    assert r.returncode == 0, r.stderr
    assert b"published 3, skipped 1 empty, failed 0" in r.stderr
    r = run(["mpub", "-t", topic, "-d", "\\0"], env, input=b"a\nb\x00c\x00")
    assert b"published 2" in r.stderr
    r = run(["tail", "-t", topic, "-n", "5", "-c", "c", "--null"], env)
    assert r.stdout == b"one\x00two\x00three\x00a\nb\x00c\x00"
    r = run(["mpub", "-t", topic, "-d", "ab"], env, input=b"x")
    assert r.returncode == 2 and b"exactly one byte" in r.stderr


def test_mpub_oversize_record(nsqd, env, topic):
    data = b"ok1\n" + b"x" * 2000 + b"\nok2\n"
    r = run(["mpub", "-t", topic, "--max-msg-size", "1000"], env, input=data)
    assert r.returncode == 1 and b"record 2 is 2000 bytes" in r.stderr
    assert b"nsqd acknowledged 1 records in this run; resume with --skip 1 (--skip 2 also leaves out record 2)" \
        in r.stderr.splitlines()[-1]
    assert topic_stats(nsqd, topic)["message_count"] == 1
    r = run(["mpub", "-t", topic, "--max-msg-size", "1000", "--skip-invalid"], env, input=data)
    assert r.returncode == 0 and b"published 2, skipped 0 empty + 1 invalid" in r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == 3
    r = run(["mpub", "-t", topic, "--skip", "2"], env, input=data)  # resume after the bad record
    assert r.returncode == 0 and b"published 1," in r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == 4


def test_mpub_failure_mid_run_says_where_to_resume(nsqd_factory, topic):
    server = nsqd_factory(max_msg_size=50)  # nsqd refuses what our --max-msg-size lets through
    data = b"a\nb\n" + b"y" * 80 + b"\nc\n"
    r = run(["mpub", "-t", topic, "--nsqd-tcp-address", server.tcp_address, "--batch-size", "1"], input=data)
    assert r.returncode == 1 and b"E_BAD_MESSAGE" in r.stderr, r.stderr
    assert b"nsqd acknowledged 2 records in this run; resume with --skip 2 (--skip 3 also leaves out record 3)" \
        in r.stderr.splitlines()[-1]
    assert topic_stats(server, topic)["message_count"] == 2


def test_tail_json_roundtrip_through_mpub(nsqd, env, topic):
    bodies = [b"plain", b"multi\nline", b"\xff\xfe binary \x00", "ünïcode".encode()]
    body = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    http_post(nsqd.http_address, "/mpub", len(bodies).to_bytes(4, "big") + body, topic=topic, binary="true")
    r = run(["tail", "-t", topic, "-n", "4", "--format", "json", "-c", "c"], env)
    assert r.returncode == 0
    r2 = run(["mpub", "-t", topic + "_copy", "--format", "json"], env, input=r.stdout)
    assert r2.returncode == 0, r2.stderr
    r3 = run(["tail", "-t", topic + "_copy", "-n", "4", "--format", "json", "-c", "c"], env)
    import base64
    copies = [json.loads(line) for line in r3.stdout.splitlines()]
    assert [base64.b64decode(d["body_base64"]) if "body_base64" in d else d["body"].encode()
            for d in copies] == bodies


def test_tail_count_across_topics_fins_everything_shown(nsqd, env, topic):
    t2 = topic + "_b"
    for t in (topic, t2):
        http_post(nsqd.http_address, "/mpub", b"\n".join(b"%s-%d" % (t.encode(), i) for i in range(5)), topic=t)
    r = run(["tail", "-t", topic, "-t", t2, "-n", "7", "-c", "durable"], env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 7
    # every shown message FINed, the rest requeued: nothing in flight, 3 left
    def settled():
        a, b = channel_stats(nsqd, topic, "durable"), channel_stats(nsqd, t2, "durable")
        return (a["in_flight_count"] + b["in_flight_count"] == 0) and a["depth"] + b["depth"] == 3
    wait_for(settled, what="7 FINed, 3 back in the queue")


def test_tail_format_template_and_print_topic(nsqd, env, topic):
    http_post(nsqd.http_address, "/pub", b"body1", topic=topic)
    r = run(["tail", "-t", topic, "-n", "1", "-c", "c", "--format", "{topic} {attempts} {body}"], env)
    assert r.stdout == f"{topic} 1 body1\n".encode()
    http_post(nsqd.http_address, "/pub", b"body2", topic=topic)
    r = run(["tail", "-t", topic, "-n", "1", "-c", "c", "--print-topic"], env)
    assert r.stdout == f"{topic} | body2\n".encode()
    r = run(["tail", "-t", topic, "-n", "1", "--format", "{nope}"], env)
    assert r.returncode == 2 and b"unknown field" in r.stderr


def test_tail_timeout_exit_3_and_idle_timeout(nsqd, env, topic):
    http_post(nsqd.http_address, "/pub", b"only", topic=topic)
    r = run(["tail", "-t", topic, "-n", "2", "--timeout", "1s", "-c", "c"], env)
    assert r.returncode == 3 and r.stdout == b"only\n" and b"after 1 of 2 messages" in r.stderr
    t0 = time.monotonic()
    r = run(["tail", "-t", topic, "--idle-timeout", "0.5s"], env)
    assert r.returncode == 0 and time.monotonic() - t0 < 10


def test_tail_default_channel_is_ephemeral(nsqd, env, topic):
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    p = subprocess.Popen(NSQCLI + ["tail", "-t", topic], env={**os.environ, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        chans = wait_for(lambda: topic_stats(nsqd, topic)["channels"], what="channel created")
        assert chans[0]["channel_name"].startswith("nsqcli_tail") and chans[0]["channel_name"].endswith("#ephemeral")
        http_post(nsqd.http_address, "/pub", b"live!", topic=topic)
        # message_count counts what reached the channel, not the client: wait for tail's FIN
        wait_for(lambda: (lambda ch: ch["message_count"] == 1 and ch["depth"] == 0 and ch["in_flight_count"] == 0)(
            topic_stats(nsqd, topic)["channels"][0]), what="delivered and FINed")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and out == b"live!\n", err


def test_tail_closed_pipe_exits_quietly(nsqd, env, topic):
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"line%d" % i for i in range(2000)), topic=topic)
    r = subprocess.run(["bash", "-c", "set -o pipefail; " + " ".join(NSQCLI) + f" -q tail -t {topic} -c c | head -n 3"],
                       capture_output=True, env={**os.environ, **env}, timeout=30)
    assert r.stdout == b"line0\nline1\nline2\n" and r.stderr == b"" and r.returncode == 0
    wait_for(lambda: channel_stats(nsqd, topic, "c")["in_flight_count"] == 0, what="nothing left in flight")


def test_tail_connection_refused(topic):
    r = run(["tail", "-t", topic, "--nsqd-tcp-address", "127.0.0.1:1", "-n", "1"])
    assert r.returncode == 1 and r.stderr == b"nsqcli: error: 127.0.0.1:1: cannot connect: Connection refused\n"


#: never imported by a plain `nsqcli pub` (the fast path in nsqcli.entry, with the client core)
PUB_FORBIDDEN = ("click", "rich", "rich.live", "nsqcli.cli", "nsqcli.client.consumer", "nsqcli.contexts",
                 "pyspark", "ssl", "dataclasses", "inspect", "typing", "uuid", "datetime", "pathlib",
                 "urllib", "ipaddress", "platform", "concurrent.futures", "logging", "encodings.idna",
                 "importlib.metadata", "tomllib")


def test_pub_does_not_import_heavy_modules(nsqd, env, topic):
    """A real publish through the console script's entry: the modules it loaded, at exit (not
    those loaded before it started, e.g. by an editable install's import finder)."""
    code = ("import sys; before = set(sys.modules); import atexit; "
            "atexit.register(lambda: print(sorted(set(sys.modules) - before))); "
            "sys.argv = ['nsqcli', 'pub', sys.argv[1], 'hello']; from nsqcli.entry import main; main()")
    r = subprocess.run([sys.executable, "-c", code, topic], capture_output=True, text=True,
                       env={**clean_env(env)}, timeout=30)
    assert r.returncode == 0, r.stderr
    loaded = set(eval(r.stdout))
    assert "nsqcli.client.producer" in loaded  # it did publish, in this process
    assert not loaded & set(PUB_FORBIDDEN), sorted(loaded & set(PUB_FORBIDDEN))
    code = ("import sys, nsqcli.cli.commands.pub, nsqcli.client.producer; "
            "bad = [m for m in ('rich.live', 'nsqcli.client.consumer', 'pyspark', 'rich', 'ssl') if m in sys.modules]; "
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr  # the click command (any other argv) too


def test_cli_tls_snappy_deflate_and_auth(nsqd_factory, tmp_path, topic):
    from nsq_fixtures import AuthServer, make_cert

    cert, key = make_cert(tmp_path)
    with AuthServer({"s3cret": [(".*", [".*"], ["subscribe", "publish"])]}) as auth:
        server = nsqd_factory(tls_cert=cert, tls_key=key, auth_http_address=auth.address)
        base = ["--nsqd-tcp-address", server.tcp_address, "--tls", "--tls-ca-file", cert]
        secret_file = tmp_path / "secret"
        secret_file.write_text("s3cret\n")
        r = run(["pub", "-t", topic, "--snappy", "--auth-secret", "s3cret", *base, "over tls+snappy"])
        assert r.returncode == 0, r.stderr
        r = run(["mpub", "-t", topic, "--deflate", "--auth-secret-file", str(secret_file), *base], input=b"x\ny")
        assert r.returncode == 0, r.stderr
        r = run(["tail", "-t", topic, "-n", "3", "-c", "c", "--deflate", *base],
                {"NSQCLI_AUTH_SECRET": "s3cret"})
        assert r.returncode == 0 and r.stdout == b"over tls+snappy\nx\ny\n", r.stderr
        r = run(["pub", "-t", topic, "--auth-secret", "wrong-one", *base, "x"])
        assert r.returncode == 1 and b"E_AUTH_FAILED" in r.stderr and b"wrong-one" not in r.stderr
        r = run(["pub", "-t", topic, "--nsqd-tcp-address", server.tcp_address, "--tls", "x"])
        assert r.returncode == 1 and b"TLS certificate verification failed" in r.stderr
        r = run(["pub", "-t", topic, "--snappy", "--deflate", *base, "x"])
        assert r.returncode == 2 and b"cannot be used together" in r.stderr


def test_cli_interop_with_go_tools(nsqd, env, topic):
    from nsqcli.sandbox import find_binary

    # nsqcli pub/mpub -> Go nsq_tail
    run(["mpub", "-t", topic], env, input=b"from\nnsqcli")
    out = subprocess.run([find_binary("nsq_tail"), f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}",
                          "-n", "2"], capture_output=True, timeout=30)
    assert out.stdout == b"from\nnsqcli\n"
    # Go to_nsq -> nsqcli tail
    t2 = topic + "_go"
    subprocess.run([find_binary("to_nsq"), f"--topic={t2}", f"--nsqd-tcp-address={nsqd.tcp_address}"],
                   input=b"from\nto_nsq\n", check=True, capture_output=True, timeout=30)
    r = run(["tail", "-t", t2, "-n", "2"], env)
    assert r.stdout == b"from\nto_nsq\n"


def test_tail_json_all_byte_values(nsqd, env, topic):
    bodies = [bytes([i]) for i in range(256)] + [bytes(range(256)), b" ", b"\n", b"\r\n", b"\x00\x00"]
    payload = len(bodies).to_bytes(4, "big") + b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    http_post(nsqd.http_address, "/mpub", payload, topic=topic, binary="true")
    r = run(["tail", "-t", topic, "-n", str(len(bodies)), "--format", "json", "-c", "c"], env)
    r2 = run(["mpub", "-t", topic + "_copy", "--format", "json"], env, input=r.stdout)
    assert r2.returncode == 0 and f"published {len(bodies)},".encode() in r2.stderr
    r3 = run(["tail", "-t", topic + "_copy", "-n", str(len(bodies)), "--format", "json", "-c", "c"], env)
    import base64
    got = [base64.b64decode(d["body_base64"]) if "body_base64" in d else d["body"].encode()
           for d in map(json.loads, r3.stdout.splitlines())]
    assert sorted(got) == sorted(bodies)


def test_mpub_rate_and_defer(nsqd, env, topic):
    t0 = time.monotonic()
    r = run(["mpub", "-t", topic, "--rate", "20", "--batch-size", "5"], env, input=b"\n".join(b"r%d" % i for i in range(30)))
    assert r.returncode == 0 and b"published 30," in r.stderr
    assert time.monotonic() - t0 >= 0.9  # 30 records at 20/s with a one-second burst
    http_post(nsqd.http_address, "/topic/create", topic=topic + "_d")
    http_post(nsqd.http_address, "/channel/create", topic=topic + "_d", channel="c")
    r = run(["mpub", "-t", topic + "_d", "--defer", "30s"], env, input=b"a\nb")
    assert r.returncode == 0
    wait_for(lambda: channel_stats(nsqd, topic + "_d", "c")["deferred_count"] == 2, what="2 deferred")
