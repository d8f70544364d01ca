"""What the click options and `pub`'s click-free fast path (nsqcli.entry) both go by, written
once (stdlib only: the fast path must not import click, nor nsqcli.cli, to learn them): the
defaults, every NSQCLI_* environment variable nsqcli reads (KNOWN; nsqcli.cli.envvars warns
about a set one that is not), and those with which `pub` may take the fast path (PUB_FAST_PATH).
tests/cli/test_envvars.py and tests/cli/test_pub_fast_path.py check them against the click
command's options and the source."""

from __future__ import annotations

#: the nsqd when neither --nsqd-tcp-address nor --lookupd-http-address is given
NSQD_TCP_ADDRESS = "127.0.0.1:4150"

#: `nsqcli pub --timeout`'s default
PUB_TIMEOUT = "10s"


def contexts_dir() -> str:
    """Where the contexts live (nsqcli.contexts): $NSQCLI_CONFIG_DIR, else $XDG_CONFIG_HOME/nsqcli,
    else ~/.config/nsqcli."""
    import os

    return os.environ.get("NSQCLI_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "nsqcli")


#: every NSQCLI_* variable nsqcli reads (a set one that is not here is said to be a typo)
KNOWN = frozenset({
    # options (envvar=...)
    "NSQCLI_NSQD_TCP_ADDRESS", "NSQCLI_NSQD_HTTP_ADDRESS", "NSQCLI_LOOKUPD_HTTP_ADDRESS", "NSQCLI_TLS",
    "NSQCLI_TLS_CA_FILE", "NSQCLI_TLS_CERT", "NSQCLI_TLS_KEY", "NSQCLI_TLS_INSECURE_SKIP_VERIFY",
    "NSQCLI_TLS_MIN_VERSION", "NSQCLI_SNAPPY", "NSQCLI_DEFLATE", "NSQCLI_DEFLATE_LEVEL", "NSQCLI_AUTH_SECRET",
    "NSQCLI_AUTH_SECRET_FILE", "NSQCLI_DESTINATION_AUTH_SECRET", "NSQCLI_CLIENT_ID", "NSQCLI_HEARTBEAT_INTERVAL",
    "NSQCLI_MSG_TIMEOUT", "NSQCLI_SAMPLE_RATE", "NSQCLI_LOOKUPD_POLL_INTERVAL", "NSQCLI_CONTEXT",
    "NSQCLI_SPARK_MASTER", "NSQCLI_SPARK_REMOTE",
    # the program's own switches and state
    "NSQCLI_DEBUG", "NSQCLI_CONFIG_DIR", "NSQCLI_NO_FAST_PATH", "NSQCLI_NO_HANDOFF", "NSQCLI_HANDOFF",
    "NSQCLI_SANDBOX_PID", "NSQCLI_SANDBOX_LOG", "NSQCLI_NSQ_BIN", "NSQCLI_IO_THREADS", "NSQCLI_OUTAGE_REMIND",
    # the test suite's (tests/conftest.py)
    "NSQCLI_TEST_NSQ_VERSION",
})

#: the NSQCLI_* variables with which `nsqcli pub` may take its click-free fast path (nsqcli.entry):
#: the one of pub's option variables that the fast path reads (NSQCLI_NSQD_TCP_ADDRESS), and those
#: that no part of a pub run reads or that the fast path honours as click does (NSQCLI_DEBUG,
#: NSQCLI_CONFIG_DIR). Any other one set - another of pub's options (TLS, auth, a lookupd,
#: NSQCLI_CONTEXT), a typo to warn about - sends the run to click, which knows them all.
#: tests/cli/test_envvars.py checks it against the click command's options.
PUB_FAST_PATH = frozenset({
    "NSQCLI_NSQD_TCP_ADDRESS",
    "NSQCLI_DEBUG", "NSQCLI_CONFIG_DIR", "NSQCLI_NO_FAST_PATH", "NSQCLI_NO_HANDOFF", "NSQCLI_SANDBOX_PID",
    "NSQCLI_NSQ_BIN",
    # other commands' options (`nsqcli sandbox --env-file` sets the first)
    "NSQCLI_NSQD_HTTP_ADDRESS", "NSQCLI_SPARK_MASTER", "NSQCLI_SPARK_REMOTE", "NSQCLI_DESTINATION_AUTH_SECRET",
})
