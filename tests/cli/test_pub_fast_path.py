"""`nsqcli pub`'s fast path (nsqcli.entry, no click) against the click command: one argv matrix
run through both on a real nsqd, same stdout, stderr and exit code; the fast path is taken
for the plain cases (else it would be correct but pointless); and what the two share (the
publish, the exit path, the defaults, the NSQCLI_* variables) is checked where it could drift,
with a property over option combinations for the one part that is the fast path's own: its
argv scanner."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.support.helpers import NSQCLI, clean_env, topic_stats

# which path ran, said at exit: through atexit (click's sys.exit) or os._exit (the fast path
# leaves without the interpreter's teardown, nsqcli.exits.exit_now)
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
        (["pub", topic, "m", "--nsqd-tcp-address", silent_server, "--timeout", "2s"], {}, b"", True),  # 3
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


def test_the_fast_path_looks_for_a_context_where_the_contexts_are(tmp_path, monkeypatch):
    """Where a selected context would be is asked of the place nsqcli.contexts asks
    (nsqcli.defaults.contexts_dir), not worked out a second time."""
    from nsqcli import contexts, defaults
    from nsqcli.entry import fast_pub_plan

    assert contexts.contexts_dir is defaults.contexts_dir
    monkeypatch.delenv("NSQCLI_CONFIG_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert contexts.config_dir() == tmp_path / "nsqcli"
    (tmp_path / "nsqcli").mkdir()
    (tmp_path / "nsqcli" / "config.toml").write_text('context = "dev"\n')
    assert fast_pub_plan(["pub", "t", "m"]) is None
    monkeypatch.setattr(defaults, "contexts_dir", lambda: str(tmp_path / "elsewhere"))
    assert fast_pub_plan(["pub", "t", "m"]) is not None


# -- what the two paths share, checked where it could drift -----------------------------------

def _no_nsqcli_variables(monkeypatch):
    for name in [k for k in os.environ if k.startswith("NSQCLI_") and k != "NSQCLI_CONFIG_DIR"]:
        monkeypatch.delenv(name)


def test_the_defaults_and_the_variables_are_the_click_commands_own_objects(monkeypatch):
    """The fast path takes --timeout's default, the default nsqd, the NSQCLI_* variables and
    the exit path from where the click command takes them (a copy drifted twice: 44c7444, cc61d16)."""
    from nsqcli import defaults, entry, exits, publish
    from nsqcli.cli import app, options
    from nsqcli.cli import envvars as cli_envvars
    from nsqcli.cli.commands.pub import pub

    timeout = next(p for p in pub.params if p.name == "timeout")
    assert timeout.default is defaults.PUB_TIMEOUT
    assert options.DEFAULT_NSQD is defaults.NSQD_TCP_ADDRESS
    assert cli_envvars.KNOWN is defaults.KNOWN and cli_envvars.PUB_FAST_PATH is defaults.PUB_FAST_PATH
    _no_nsqcli_variables(monkeypatch)
    plan = entry.fast_pub_plan(["pub", "t", "m"])
    assert plan["nsqd"] == [defaults.NSQD_TCP_ADDRESS] and plan["timeout"] == 10.0 and not plan["timeout_given"]
    monkeypatch.setattr(defaults, "PUB_TIMEOUT", "7s")  # read from there, not a copy of the same value
    monkeypatch.setattr(defaults, "NSQD_TCP_ADDRESS", "127.0.0.1:4999")
    plan = entry.fast_pub_plan(["pub", "t", "m"])
    assert plan["nsqd"] == ["127.0.0.1:4999"] and plan["timeout"] == 7.0 and not plan["timeout_given"]
    assert app.DeadlineExceeded is exits.DeadlineExceeded and app.write_stdout is exits.write_stdout
    assert issubclass(app.App, exits.Voice)
    # no second copy of the exit path or the publish left in the fast path
    assert not {"_guarded", "_fail", "_silence_stdout", "_exit_now", "_say", "_ENV_KNOWN"} & set(vars(entry))
    assert "publish_one" in entry._publish.__code__.co_names and publish.publish_one.__module__ == "nsqcli.publish"


def test_every_variable_of_pubs_options_but_the_parsed_one_sends_the_run_to_click(monkeypatch):
    """PUB_FAST_PATH holds no variable of an option the fast path does not parse: a new pub
    option with an envvar cannot be silently ignored by the fast path. And any NSQCLI_* variable
    outside the set (a known one of another option, or a typo click would warn about) goes to click."""
    from nsqcli.cli.commands.pub import pub
    from nsqcli.cli.root import cli
    from nsqcli.entry import fast_pub_plan
    from nsqcli.defaults import KNOWN, PUB_FAST_PATH

    read_by_pub = {p.envvar for p in [*pub.params, *cli.params] if isinstance(p.envvar, str)}
    assert "NSQCLI_TLS" in read_by_pub and "NSQCLI_CONTEXT" in read_by_pub  # the introspection works
    assert PUB_FAST_PATH <= KNOWN
    assert PUB_FAST_PATH & read_by_pub == {"NSQCLI_NSQD_TCP_ADDRESS"}
    _no_nsqcli_variables(monkeypatch)
    assert fast_pub_plan(["pub", "t", "m"]) is not None
    for name in sorted(KNOWN - PUB_FAST_PATH) + ["NSQCLI_NSQD_TCP_ADRESS"]:
        monkeypatch.setenv(name, "1")
        assert fast_pub_plan(["pub", "t", "m"]) is None, name
        monkeypatch.delenv(name)


class _Published(Exception):
    """Raised by the stand-in for publish_one: what it was called with."""


def _publish_call(monkeypatch, run) -> dict | Exception:
    """What ``run()`` would publish (publish_one's arguments, the addresses resolved), or what
    it raised before publishing."""
    import nsqcli.publish

    def capture(voice, topic, message, *, cfg, resolve, **kw):
        raise _Published({"verbosity": voice.verbosity, "topic": topic, "message": message, "cfg": cfg,
                          "addresses": resolve(None), **kw})

    monkeypatch.setattr(nsqcli.publish, "publish_one", capture)
    try:
        run()
    except _Published as e:
        return e.args[0]
    except (Exception, SystemExit) as e:  # click's refusal of what the fast path took
        return e
    return AssertionError("nothing published")


def _argvs():
    """`pub` argvs near the fast path's edge: a plain publish built from pieces (TOPIC, MESSAGE,
    options with good values), often with one thing added that click may refuse or read
    otherwise (a bad value, a repeated option, a stray token), all in any order."""
    from hypothesis import strategies as st

    def one(*choices):
        return st.sampled_from(choices)

    def maybe(piece, repeat=False):
        return st.one_of(st.just([]), piece.map(lambda p: [p]), st.lists(piece, min_size=2, max_size=2)
                         if repeat else st.just([]))

    topic = one(["events"], ["-t", "events"], ["--topic=events"], ["--topic", "other.t#ephemeral"])
    message = one([], ["msg"], ["-"], ["two words"], ["--", "-"])
    nsqd = one(["--nsqd-tcp-address", "127.0.0.1:4150"], ["--nsqd-tcp-address=[::1]:4150"],
               ["--nsqd-tcp-address", "127.0.0.1:4151"])
    timeout = one(["--timeout", "5s"], ["--timeout=1h30m"], ["--timeout", "250ms"], ["--timeout", "3"])
    defer = one(["--defer", "2s"], ["--defer=250ms"])
    flag = one(["--json"], ["--fanout"], ["-q"], ["--quiet"])
    odd = one(["--timeout", "0"], ["--timeout", "soon"], ["--timeout", "-1s"], ["--timeout", "5s"], ["--defer", "later"],
              ["--defer", "-1s"], ["--defer", "1s"], ["--nsqd-tcp-address", "nope"], ["--nsqd-tcp-address", "h:0"],
              ["--nsqd-tcp-address", "tcp://127.0.0.1:4150"], ["--nsqd-tcp-address", "a:1,b:2"], ["-t", "events"],
              ["-t", "other"], ["--topic", "bad/topic"], ["x" * 65], ["extra"], [""], ["-v"], ["--"], ["--json=1"],
              ["-tevents"], ["--snappy"], ["-topic"], ["--timeout"], ["-t"], ["--defer", "--json"], ["-q", "-q"])
    pieces = st.tuples(topic, message, maybe(nsqd, True), maybe(timeout), maybe(defer), st.lists(flag, max_size=3),
                       maybe(odd))
    return pieces.map(lambda p: [p[0], p[1], *p[2], *p[3], *p[4], *p[5], *p[6]]).flatmap(
        lambda groups: st.permutations(groups)).map(lambda groups: ["pub"] + [w for g in groups for w in g])


def test_the_fast_path_takes_only_what_click_parses_the_same(monkeypatch):
    """A property over option combinations: whenever the fast path's scanner accepts an argv
    (with or without NSQCLI_NSQD_TCP_ADDRESS), the click command accepts it too and calls the
    same publish with the same arguments (topic, message, addresses, timeout and whether it was
    given, defer, fanout, --json, -q, the Config). A scanner that took something click refuses
    or reads otherwise (a repeated option, a scheme in an address: the two drifts) fails here."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    from nsqcli.cli.root import cli
    from nsqcli.entry import _publish, fast_pub_plan

    _no_nsqcli_variables(monkeypatch)
    taken = []

    @settings(max_examples=600, deadline=None, derandomize=True, database=None)
    @given(_argvs(), st.sampled_from([None] * 6 + ["127.0.0.1:4150"] * 3 + ["127.0.0.1:1 [::1]:2"] * 3
                                     + ["nope", " ", "tcp://h:1"]))
    @example(["pub", "events", "m", "--timeout", "1s", "--timeout", "2s"], None)  # the drifts: a repeated option,
    @example(["pub", "events", "m", "--nsqd-tcp-address", "tcp://127.0.0.1:4150"], None)  # a scheme
    @example(["pub", "events", "m", "--nsqd-tcp-address", "a:1,b:2"], None)  # a comma list
    @example(["pub", "events", "m"], "127.0.0.1:4150,127.0.0.1:4151")
    @example(["pub", "events", "m", "--timeout"], None)  # values missing
    @example(["pub", "events", "--defer", "--json"], None)
    @example(["pub", "events", "m", "-t"], None)
    def check(argv, env_nsqd):
        with monkeypatch.context() as m:
            if env_nsqd is not None:
                m.setenv("NSQCLI_NSQD_TCP_ADDRESS", env_nsqd)
            plan = fast_pub_plan(argv)
            if plan is None:
                return
            taken.append(argv)
            fast = _publish_call(m, lambda: _publish(plan))
            slow = _publish_call(m, lambda: cli.main(args=argv, prog_name="nsqcli", standalone_mode=False))
        assert isinstance(fast, dict), (argv, fast)
        assert fast == slow, (argv, env_nsqd, fast, slow)

    check()
    assert len(taken) > 200 and len({len(a) for a in taken}) > 5, taken  # the fast path was exercised
