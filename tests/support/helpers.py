"""Small helpers for integration tests: nsqd's HTTP API, waiting for conditions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from nsqcli import Config, Consumer


def http_get_json(address: str, path: str, **params) -> dict:
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    with urllib.request.urlopen(f"http://{address}{path}{query}", timeout=5) as resp:
        return json.loads(resp.read())


def http_post(address: str, path: str, body: bytes = b"", **params) -> bytes:
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    req = urllib.request.Request(f"http://{address}{path}{query}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read()


def lookup_producers(lookupd, topic: str) -> list:
    """The producers nsqlookupd lists for ``topic``; [] while it does not know the topic yet
    (its 404 TOPIC_NOT_FOUND), so that a wait_for can poll registration."""
    try:
        return http_get_json(lookupd.http_address, "/lookup", topic=topic)["producers"]
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise


def topic_stats(nsqd, topic: str) -> dict | None:
    """The /stats entry of ``topic`` on this nsqd (a sandbox Server), or None."""
    stats = http_get_json(nsqd.http_address, "/stats", format="json", topic=topic)
    for t in stats.get("topics") or []:
        if t["topic_name"] == topic:
            return t
    return None


def channel_stats(nsqd, topic: str, channel: str) -> dict | None:
    t = topic_stats(nsqd, topic)
    for c in (t or {}).get("channels") or []:
        if c["channel_name"] == channel:
            return c
    return None


def drained(nsqd, topic: str, channel: str, total: int | None = None) -> dict | None:
    """The channel's /stats once everything in it is FINed, else None. With ``total``, only once
    it has received that many: a publish returns before nsqd's topic pump has copied the
    messages into the channel, and depth 0 with nothing in flight holds before that too."""
    c = channel_stats(nsqd, topic, channel)
    ok = (c is not None and c["depth"] == 0 and c["in_flight_count"] == 0
          and (total is None or c["message_count"] >= total))
    return c if ok else None


def finished(nsqd, topic: str, channel: str) -> int:
    """The FINs of the channel's connected clients (/stats drops a client's count when it leaves)."""
    return sum(cl["finish_count"] for cl in (channel_stats(nsqd, topic, channel) or {}).get("clients") or [])


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value {last!r})")


def signal_and_wait(p, sig, timeout: float = 30, said=lambda: "") -> tuple[bytes, bytes]:
    """Send ``sig`` to a command and wait for its exit: (stdout, stderr). One still running
    ``timeout`` later fails the test with what it said (``said()``: stderr read elsewhere, plus
    the rest) and every thread's stack (SIGUSR1: nsqcli's daemons dump them), to say where it hung."""
    import signal

    import pytest

    p.send_signal(sig)
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(1)
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"still running {timeout:g} s after {signal.Signals(sig).name}; its stderr and stacks:\n"
                    + said() + (err or b"").decode(errors="replace"))


NSQCLI = [sys.executable, "-m", "nsqcli"]


def clean_env(extra: dict | None = None) -> dict:
    """This process's environment without NSQCLI_* (a developer's settings must not leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQCLI_")}
    env["NSQCLI_CONFIG_DIR"] = os.environ["NSQCLI_CONFIG_DIR"]  # the tests' own (empty) contexts
    env.update(extra or {})
    return env


def run_nsqcli(args, env_addr=None, input=None, timeout=30, **kw):
    """Run the real nsqcli executable to completion; stdout and stderr captured."""
    return subprocess.run(NSQCLI + list(args), input=input, capture_output=True, timeout=timeout,
                          env=clean_env(env_addr), **kw)


def shell(script: str, timeout: float, **kw) -> subprocess.CompletedProcess:
    """``bash -c script`` to completion, stdout and stderr captured, in a session of its own:
    when ``timeout`` passes, every process of the pipeline is killed (subprocess.run's timeout
    kills bash alone, and left a hung `nsqcli tail | head`'s tail running for good)."""
    import signal

    p = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def one_error_line(r, code: int, pattern: str) -> str:
    err = r.stderr.decode()
    assert r.returncode == code, (r.returncode, err)
    lines = [ln for ln in err.splitlines() if not ln.startswith("nsqcli: warning:")]
    assert len(lines) == 1 and lines[0].startswith("nsqcli: error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    return lines[0]


class Collector:
    def __init__(self, want: int):
        self.want = want
        self.msgs = []
        self.done = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, m):
        with self.lock:
            self.msgs.append((m.body, m.attempts, m.nsqd, m.id))
            if len(self.msgs) >= self.want:
                self.done.set()

    @property
    def bodies(self):
        return [b for b, *_ in self.msgs]


def consume(topic, want, addresses=(), lookupds=(), channel="c", timeout=20, **cfg):
    col = Collector(want)
    c = Consumer(topic, channel, col, nsqd_tcp_addresses=list(addresses),
                 lookupd_http_addresses=list(lookupds), config=Config(**cfg))
    c.start()
    try:
        assert col.done.wait(timeout), f"got {len(col.msgs)} of {want}"
    finally:
        c.stop()
    return col


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z nsqcli [\w-]+\[\d+\] (DEBUG|INFO|WARNING|ERROR): (.*)$")


def plain_lines(text: str) -> list[str]:
    """A daemon's stderr with its log lines (--log-format text) in the plain form ('nsqcli: ...',
    'nsqcli: warning: ...'), so one expectation fits both."""
    out = []
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m is None:
            out.append(line)
        else:
            level, message = m.groups()
            out.append("nsqcli: " + {"WARNING": "warning: ", "ERROR": "error: "}.get(level, "") + message)
    return out
