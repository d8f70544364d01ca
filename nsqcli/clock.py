"""When this process started, as far as nsqcli can tell (stdlib only, imported first by the
console script): `--timeout` counts from here, so the interpreter's start-up, pre-checks,
lookups and handshakes all spend the same budget."""

from __future__ import annotations

import time

STARTED = time.monotonic()


def deadline_of(timeout: float | None) -> float | None:
    """The monotonic instant ``--timeout`` ends, counted from process start, not from when the
    command got round to its main work. ``None``: no deadline."""
    return None if timeout is None else STARTED + timeout
