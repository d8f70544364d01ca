"""What every command's refusal rows check (tests/cli/test_<command>.py): the documented exit code,
one line on stderr naming the problem (``nsqcli: error: ...``), nothing on stdout, never a
traceback - and, for the rows run against the session's nsqd, that nothing reached it.

A usage error (exit 2) is refused before anything starts, so its rows run nsqcli in this process
(tests/support/inprocess.py: the real entry, milliseconds instead of an interpreter start); the other
rows run the real executable. tests/cli/test_app.py proves both give the same for the same argv."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.helpers import run_nsqcli, topic_stats
from tests.support.inprocess import run_in_process

DEAD = "127.0.0.1:1"  # nothing listens there
FILE = str(Path(__file__).resolve())  # an existing file (not a directory)


def refused(r, code: int, pattern: str, *, warnings: bool = False, stdout_empty: bool = True) -> str:
    """``r`` (a run's result: returncode, stdout, stderr) is the one-line refusal: exit ``code``,
    exactly one stderr line, an error matching ``pattern``, an empty stdout (unless not
    ``stdout_empty``: a --json summary said before a deadline's exit 3). ``warnings``: lines
    ``nsqcli: warning: ...`` beside the error are allowed."""
    err = r.stderr.decode()
    assert "Traceback" not in err, err
    assert r.returncode == code, (r.returncode, err)
    lines = [ln for ln in err.splitlines() if not (warnings and ln.startswith("nsqcli: warning: "))]
    assert len(lines) == 1, err
    assert lines[0].startswith("nsqcli: error: ") and re.search(pattern, lines[0]), lines[0]
    if stdout_empty:
        assert r.stdout == b"", r.stdout
    return lines[0]


def untouched(nsqd, *topics: str) -> None:
    """Nothing published to, nothing subscribed on these topics (nsqd never heard of them)."""
    for t in topics:
        assert topic_stats(nsqd, t) is None, (t, topic_stats(nsqd, t))


def fill(args, nsqd, topic, file: str = "") -> list[str]:
    """{tcp}/{http} -> the session nsqd's addresses, {t} -> this row's topic, {file} -> an existing file."""
    return [a.format(tcp=nsqd.tcp_address, http=nsqd.http_address, t=topic, file=file) for a in args]


def ids(rows, at: int = 0, width: int = 60) -> list[str]:
    """Test ids: the row's argv (its element ``at``), joined and cut to ``width``."""
    return [" ".join(row[at])[:width] for row in rows]


# -- the rows' checks, one per table kind (each command's file holds its rows) --------------------

def bad_input(args, code: int, pattern: str, env: dict | None = None) -> None:
    """A bad input a user tried (issue 12's table): refused in one line; warnings beside it allowed."""
    stdin = b"a\n" if env is None else b""
    r = run_in_process(args, env, stdin) if code == 2 else run_nsqcli(args, env, input=stdin, timeout=60)
    refused(r, code, pattern, warnings=True)


def grammar_row(args, code: int, pattern: str) -> None:
    """One grammar for every command: a conflict, a missing TOPIC, --timeout 0, an unreachable
    nsqlookupd - each one line."""
    refused(run_in_process(args) if code == 2 else run_nsqcli(args), code, pattern)


def argv_footgun(nsqd, topic, args, pattern) -> None:
    """A command line click would have guessed at (a Go-style -flag, an option given twice):
    refused before anything is published or consumed."""
    r = run_in_process(fill(args, nsqd, topic), input=b"a\nb\n")
    refused(r, 2, pattern.replace("{t}", re.escape(topic)))
    untouched(nsqd, topic, topic + "_b", "opic", topic[1:])


def address_footgun(nsqd, topic, env, args, pattern) -> None:
    """An address with a scheme or a comma list: refused naming the fix, nothing touched."""
    env = {k: v.format(tcp=nsqd.tcp_address, http=nsqd.http_address) for k, v in env.items()}
    r = run_in_process(fill(args, nsqd, topic), env, input=b"a\n")
    refused(r, 2, pattern.format(t=re.escape(topic), tcp=re.escape(nsqd.tcp_address),
                                 http=re.escape(nsqd.http_address)))
    untouched(nsqd, topic, topic + "_src")


def port_mix_up(nsqd, lookupd, topic, args, pattern) -> None:
    """A TCP port where an HTTP port is meant, or the other server's HTTP port: exit 1, one error
    line with the hint, nothing touched."""
    args = [a.format(tcp=nsqd.tcp_address, http=nsqd.http_address, lhttp=lookupd.http_address, t=topic) for a in args]
    r = run_nsqcli(args, timeout=30)
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err, (r.returncode, err)
    errors = [ln for ln in err.splitlines() if not ln.startswith("nsqcli: warning: ")]
    assert len(errors) == 1 and errors[0].startswith("nsqcli: error: "), err
    assert re.search(pattern.format(tcp=re.escape(nsqd.tcp_address)), errors[0]), errors[0]
    untouched(nsqd, topic)


def run_closing(args, env=None, close=(), input=None, timeout=30):
    """The real nsqcli with the file descriptors in ``close`` closed (as the shell's ``<&-``,
    ``>&-``, ``2>&-``)."""
    import os
    import subprocess

    from tests.support.helpers import NSQCLI, clean_env

    def pre():
        for fd in close:
            os.close(fd)

    kw = {"stdin": subprocess.DEVNULL} if input is None else {"input": input}
    return subprocess.run(NSQCLI + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=clean_env(env), preexec_fn=pre, timeout=timeout, **kw)
