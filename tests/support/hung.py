"""A small real cluster whose nodes can hang on cue: ``cluster`` (1 nsqlookupd + 3 nsqd of their
own, stopped after the test) and ``stopped(*servers)``, which SIGSTOPs servers started here - by
pid - and always SIGCONTs them. A stopped nsqd still accepts TCP connections (the kernel does)
but never answers: the hung node of a real estate, which a refused port does not play.

Import the fixture into a test module: ``from tests.support.hung import cluster, stopped  # noqa: F401``."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from nsqcli.sandbox import Sandbox


@pytest.fixture
def cluster(tmp_path):
    sb = Sandbox(base_dir=str(tmp_path / "cluster"))
    sb.start()
    try:
        sb.add_nsqd()
        sb.add_nsqd()
        yield sb
    finally:
        for server in sb.nsqds + [sb.lookupd]:  # a test that failed inside stopped() left none stopped
            if server.running:
                os.kill(server.pid, signal.SIGCONT)
        sb.stop()


@contextlib.contextmanager
def stopped(*servers):
    """The servers (sandbox Servers this test started) hang for the block: SIGSTOP, then SIGCONT."""
    done = []
    try:
        for s in servers:
            os.kill(s.pid, signal.SIGSTOP)
            done.append(s)
        yield
    finally:
        for s in done:
            if s.running:
                os.kill(s.pid, signal.SIGCONT)


def timed(fn, *args, **kw):
    """(fn's result, seconds it took)."""
    t0 = time.monotonic()
    result = fn(*args, **kw)
    return result, time.monotonic() - t0
