"""`nsqcli pub`'s fast path (nsqcli.entry, no click) against the click command: one argv matrix
run through both on a real nsqd, same stdout, stderr and exit code; and the fast path is taken
for the plain cases (else it would be correct but pointless)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from helpers import NSQCLI, clean_env, topic_stats

# which path ran, said at exit: through atexit (click's sys.exit) or os._exit (the fast path
# leaves without the interpreter's teardown, nsqcli.entry._exit_now)
IMPORTED = """
import atexit, os, sys
mark = lambda: sys.stderr.write('click' in sys.modules and 'CLICK\\n' or 'FAST\\n')
atexit.register(mark)
_exit = os._exit
def leave(code):
    mark()
    sys.stderr.flush()
    _exit(code)
os._exit = leave
sys.argv = ['nsqcli'] + sys.argv[1:]
from nsqcli.entry import main
main()
"""


def both(args, env=None, input=b""):
    """(fast, click) results of one invocation."""
    out = []
    for off in ("0", "1"):
        r = subprocess.run(NSQCLI + list(args), input=input, capture_output=True, timeout=30,
                           env=clean_env({**(env or {}), "NSQCLI_NO_FAST_PATH": off}))
        out.append((r.returncode, r.stdout, r.stderr))
    return out


def took_fast_path(args, env=None, input=b"") -> bool:
    r = subprocess.run([sys.executable, "-c", IMPORTED, *args], input=input, capture_output=True,
                       timeout=30, env=clean_env(env))
    return r.stderr.endswith(b"FAST\n")


@pytest.fixture
def silent_server():
    """Accepts connections (the kernel's backlog) and never answers: a deadline must pass."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield "127.0.0.1:%d" % s.getsockname()[1]
    s.close()


def test_same_output_and_exit_codes_on_both_paths(nsqd, topic, silent_server):
    addr = nsqd.tcp_address
    env = {"NSQCLI_NSQD_TCP_ADDRESS": addr}
    cases = [  # (argv, env, stdin, fast path expected)
        (["pub", topic, "hello"], env, b"", True),
        (["pub", "-t", topic, "hi there", "--json"], env, b"", True),
        (["pub", f"--topic={topic}", f"--nsqd-tcp-address={addr}", "x", "--json"], {}, b"", True),
        (["pub", topic, "--nsqd-tcp-address", addr, "--nsqd-tcp-address", addr, "--fanout", "--json", "m"],
         {}, b"", True),
        (["pub", topic, "--defer", "1s", "--timeout", "5s", "--json", "later"], env, b"", True),
        (["pub", topic, "--json"], env, b"from stdin\x00\xff", True),
        (["pub", "-t", topic, "-", "--json"], env, bytes(range(256)), True),
        (["pub", topic, "-q", "--json", "m"], env, b"", True),
        (["pub", topic, "--json"], env, b"x" * (1024 * 1024 + 1), True),  # warning; nsqd's limit
        (["pub", topic], env, b"", True),                                     # empty message: 2
        (["pub", topic, "m", "--nsqd-tcp-address", "127.0.0.1:1"], {}, b"", True),   # refused: 1
        (["pub", topic, "m", "--nsqd-tcp-address", silent_server, "--timeout", "300ms"], {}, b"", True),  # 3
        (["pub", "bad/topic", "m"], env, b"", False),
        (["pub", "-t", topic, "a", "b"], env, b"", False),
        (["pub"], env, b"", False),
        (["pub", "-t"], env, b"", False),
        (["pub", topic, "m", "--timeout", "0"], env, b"", False),
        (["pub", topic, "m", "--timeout", "soon"], env, b"", False),
        (["pub", topic, "m", "--nsqd-tcp-address", "nope"], env, b"", False),
        (["pub", topic, "m"], {"NSQCLI_NSQD_TCP_ADDRESS": "nope"}, b"", False),
        (["pub", topic, "m", "--snappy"], env, b"", False),
        (["pub", topic, "m"], {**env, "NSQCLI_CONTEXT": "none"}, b"", False),
        (["pub", topic, "m"], {**env, "NSQCLI_CONTEXT": "missing"}, b"", False),
        (["pub", topic, "m", "--bogus"], env, b"", False),
        (["-q", "pub", topic, "m"], env, b"", False),
        (["pub", "-t", topic, "-t", topic + "x", "m"], env, b"", False),          # given twice: 2
        (["pub", topic, "m", "--timeout", "1s", "--timeout", "2s"], env, b"", False),
        (["pub", "-topic", topic, "m"], env, b"", False),                         # Go-style flag: 2
        (["pub", topic, "m", "--nsqd-tcp-address", f"tcp://{addr}"], {}, b"", False),
        (["pub", topic, "m"], {"NSQCLI_NSQD_TCP_ADDRESS": f"{addr},{addr}"}, b"", False),
        (["pub", "-t", topic, "m", topic], env, b"", False),                      # -t and two args
    ]
    for args, extra, stdin, fast in cases:
        fast_r, click_r = both(args, extra, stdin)
        assert fast_r == click_r, (args, fast_r, click_r)
        assert took_fast_path(args, extra, stdin) == fast, args
    assert topic_stats(nsqd, topic)["message_count"] >= 2 * 10


def test_the_fast_path_builds_the_config_click_builds():
    from nsqcli.cli.options import build_config
    from nsqcli.client.config import Config

    cfg = build_config({"nsqd_tcp_addresses": ("127.0.0.1:4150",), "lookupd_http_addresses": (), "tls": False,
                        "tls_ca_file": None, "tls_cert": None, "tls_key": None, "tls_min_version": None,
                        "tls_insecure_skip_verify": False, "snappy": False, "deflate": False, "deflate_level": 6,
                        "auth_secret": None, "auth_secret_file": None, "client_id": None,
                        "heartbeat_interval": 30.0, "msg_timeout": None})
    assert cfg == Config()


def test_a_selected_context_goes_to_click(tmp_path, monkeypatch):
    from nsqcli.entry import fast_pub_plan

    monkeypatch.setenv("NSQCLI_CONFIG_DIR", str(tmp_path))
    (tmp_path / "config.toml").write_text('context = "dev"\n')
    assert fast_pub_plan(["pub", "t", "m"]) is None
    (tmp_path / "config.toml").write_text("")  # `nsqcli context use` of none
    assert fast_pub_plan(["pub", "t", "m"]) is not None
