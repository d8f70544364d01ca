"""Every NSQCLI_* environment variable nsqcli reads. One set is said to be a typo (a variable
that is not here is ignored by every command): ``NSQCLI_NSQD_TCP_ADRESS`` gets a warning with
the name it resembles, instead of silently connecting to the default nsqd.
The sets are in nsqcli/defaults.py (stdlib only: `pub`'s fast path reads them without nsqcli.cli);
tests/cli/test_envvars.py checks them against the options' envvars and the source."""

from __future__ import annotations

import os

from ..defaults import KNOWN, PUB_FAST_PATH  # noqa: F401 - the sets themselves are click-free, for the fast path


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
