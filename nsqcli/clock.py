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


def left(deadline: float | None, most: float, floor: float = 0.001) -> float:
    """Seconds a step may take: ``most``, or what is left until ``deadline`` if that is less
    (never below ``floor``: a call given 0 might wait for ever or refuse). ``None``: ``most``."""
    if deadline is None:
        return most
    return max(floor, min(most, deadline - time.monotonic()))
