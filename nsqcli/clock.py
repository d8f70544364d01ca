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


_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration as nsqcli and Go's time.ParseDuration write them: '250ms', '2s',
    '1.5m', '1h30m', '2h45m30.5s', or a bare number of seconds ('3'). ValueError otherwise."""
    import re

    s = re.sub(r"\s+", "", str(text))  # '2 s', ' 1h 30m '
    if re.fullmatch(r"(\d+(\.\d*)?|\.\d+)", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", s)
    if not s or not parts or "".join(n + u for n, u in parts) != s:
        raise ValueError(f"{text!r} is not a duration (use e.g. 500ms, 2s, 1m, 1h30m)")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
