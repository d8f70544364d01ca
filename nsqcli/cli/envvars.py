"""Every NSQCLI_* environment variable nsqcli reads. One set is said to be a typo (a variable
that is not here is ignored by every command): ``NSQCLI_NSQD_TCP_ADRESS`` gets a warning with
the name it resembles, instead of silently connecting to the default nsqd.
tests/cli/test_envvars.py checks this set against the options' envvars and the source."""

from __future__ import annotations

import os

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


def unknown(environ=None) -> list[tuple[str, str | None]]:
    """(name, the known name it resembles or None) for each NSQCLI_* variable nsqcli does not read."""
    from .command import did_you_mean

    env = os.environ if environ is None else environ
    return [(name, did_you_mean(name, KNOWN)) for name in sorted(env)
            if name.startswith("NSQCLI_") and name not in KNOWN]


def warn_unknown(say) -> None:
    for name, like in unknown():
        say(f"{name} is set but nsqcli reads no such variable"
            + (f" (did you mean {like}?)" if like else " (see the ENVIRONMENT of 'nsqcli --help')"))
