"""nsqcli.daemon.logs: the daemons' log lines (text and json), one whole line per record."""

import json
import logging
import re
import subprocess
import sys

import pytest

from nsqcli.daemon.logs import setup, utc_stamp

TEXT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) nsqcli to-file\[(\d+)\] (\w+): (.*)")


@pytest.fixture
def lines():
    out = []
    yield out
    logging.getLogger("nsqcli").handlers[:] = []


def test_text_lines_have_utc_z_milliseconds_pid_and_level(lines):
    import calendar
    import os
    import time

    log = setup("to-file", "info", write=lines.append)
    before = time.time()
    logging.getLogger("nsqcli.archive.archiver").warning("disk %s", "slow")
    logging.getLogger("nsqcli.archive.archiver").debug("not at info")
    log.info("two\nlines")  # a record never spans lines
    assert len(lines) == 2
    m = TEXT.fullmatch(lines[0])
    assert m and m[2] == str(os.getpid()) and m[3] == "WARNING" and m[4] == "disk slow", lines
    assert abs(calendar.timegm(time.strptime(m[1][:19], "%Y-%m-%dT%H:%M:%S")) - before) < 5  # UTC
    assert TEXT.fullmatch(lines[1])[4] == "two\\nlines"


def test_json_lines_carry_event_and_fields(lines):
    log = setup("to-nsq", "debug", "json", write=lines.append)
    log.warning("source: %s: refused", "127.0.0.1:4150",
                extra={"event": "source_down", "fields": {"source": "127.0.0.1:4150", "message": "clash"}})
    log.debug("plain")
    a, b = (json.loads(x) for x in lines)
    assert a["event"] == "source_down" and a["level"] == "warning" and a["command"] == "to-nsq"
    assert a["message"] == "source: 127.0.0.1:4150: refused" and a["source"] == "127.0.0.1:4150"
    assert a["field_message"] == "clash"  # a field never overwrites the envelope
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", a["time"]) and isinstance(a["pid"], int)
    assert b["event"] == "log" and b["level"] == "debug"


def test_bad_level_or_format_is_refused():
    with pytest.raises(ValueError, match="log level"):
        setup("tail", "loud")
    with pytest.raises(ValueError, match="log format"):
        setup("tail", "info", "xml")


def test_utc_stamp():
    assert utc_stamp(0.5) == "1970-01-01T00:00:00.500Z" and utc_stamp(86399.9999) == "1970-01-01T23:59:59.999Z"


def test_lines_from_many_threads_stay_whole_on_real_stderr(tmp_path):
    script = tmp_path / "many.py"
    script.write_text(
        "import threading\n"
        "from nsqcli.daemon.logs import setup\n"
        "log = setup('tail', 'info')\n"
        "def spam(n):\n"
        "    for i in range(1000):\n"
        "        log.warning('thread %d line %d %s', n, i, 'x' * (i % 300))\n"
        "ts = [threading.Thread(target=spam, args=(n,)) for n in range(8)]\n"
        "[t.start() for t in ts]\n"
        "[t.join() for t in ts]\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60)
    got = r.stderr.decode().splitlines()
    assert r.returncode == 0 and len(got) == 8000
    bad = [ln for ln in got if not re.fullmatch(r"\S+Z nsqcli tail\[\d+\] WARNING: thread \d line \d+ x*", ln)]
    assert not bad, bad[:3]
