"""nsqcli.daemon.statusfile: atomic replacement (a reader never sees a partial file), refusals at
start-up, a write error naming the path."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from nsqcli.daemon.statusfile import StatusFile


def test_write_then_read(tmp_path):
    path = tmp_path / "status.json"
    sf = StatusFile(str(path))
    sf.write({"command": "to-file", "counters": {"fsyncs": 1}, "health": {"ok": True, "reason": ""}})
    assert json.loads(path.read_text()) == {"command": "to-file", "counters": {"fsyncs": 1},
                                            "health": {"ok": True, "reason": ""}}
    sf.write({"command": "to-file", "counters": {"fsyncs": 2}})
    assert json.loads(path.read_text())["counters"] == {"fsyncs": 2}
    assert sorted(os.listdir(tmp_path)) == ["status.json"]  # no temporary file left behind
    assert sf.writes == 2


def test_a_reader_never_sees_a_partial_file(tmp_path):
    path = tmp_path / "status.json"
    sf = StatusFile(str(path))
    big = {"depth": [{"topic": f"t{i}", "channel": "c", "depth": i} for i in range(100)]}
    sf.write({"n": -1, **big})
    stop = threading.Event()
    seen, bad = [], []

    def reader():
        while not stop.is_set():
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # never: os.replace leaves no gap
                bad.append("missing")
                continue
            try:
                seen.append(json.loads(data)["n"])
            except ValueError:
                bad.append(data[:80])
            time.sleep(0.0005)  # let the writer run: a busy reader only slows the test

    t = threading.Thread(target=reader)
    t.start()
    try:
        for n in range(200):
            sf.write({"n": n, **big})
    finally:
        stop.set()
        t.join(10)
    assert not bad
    assert len(seen) > 10 and seen == sorted(seen)  # whole files, in the order written
    assert json.loads(path.read_text())["n"] == 199


def test_check_refuses_a_missing_directory(tmp_path):
    with pytest.raises(ValueError, match=r"directory .*nope does not exist") as e:
        StatusFile.check(str(tmp_path / "nope" / "status.json"))
    assert "\n" not in str(e.value)


def test_check_refuses_a_directory(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        StatusFile.check(str(tmp_path))


def test_check_refuses_a_parent_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        StatusFile.check(str(tmp_path / "file" / "status.json"))


def test_check_refuses_an_empty_path():
    with pytest.raises(ValueError, match="empty"):
        StatusFile.check("")


def test_check_refuses_an_unwritable_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):  # root writes anywhere: try /proc's read-only files instead
            with pytest.raises(ValueError, match="cannot create a file in /proc"):
                StatusFile.check("/proc/nsqcli-status.json")
        else:
            with pytest.raises(ValueError, match="cannot create a file in .*ro"):
                StatusFile.check(str(ro / "status.json"))
    finally:
        ro.chmod(0o755)
    assert os.listdir(ro) == []


def test_check_accepts_a_writable_directory_and_leaves_nothing(tmp_path):
    StatusFile.check(str(tmp_path / "status.json"))
    (tmp_path / "status.json").write_text("old")  # an existing file is replaced later, fine
    StatusFile.check(str(tmp_path / "status.json"))
    assert os.listdir(tmp_path) == ["status.json"]


def test_a_write_error_names_the_path(tmp_path):
    path = tmp_path / "gone" / "status.json"
    (tmp_path / "gone").mkdir()
    sf = StatusFile(str(path))
    sf.write({"n": 1})
    (tmp_path / "gone" / "status.json").unlink()
    (tmp_path / "gone").rmdir()  # the directory went away mid-run
    with pytest.raises(OSError) as e:
        sf.write({"n": 2})
    assert str(e.value).startswith(f"cannot write the status file {path}: ")
    assert "\n" not in str(e.value) and e.value.errno is not None


def test_a_path_that_became_a_directory_is_an_os_error_and_no_temp_file_stays(tmp_path):
    path = tmp_path / "status.json"
    path.mkdir()
    (path / "x").write_text("keep")  # a non-empty directory: os.replace cannot take it
    with pytest.raises(OSError, match=f"cannot write the status file {path}"):
        StatusFile(str(path)).write({"n": 1})
    assert sorted(os.listdir(tmp_path)) == ["status.json"]
