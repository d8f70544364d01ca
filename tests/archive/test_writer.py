"""Archive file naming (archive/writer.py): names stay inside the directory they are made in,
whatever the topic, the host and the date put into them."""

from __future__ import annotations

import pytest

from nsqcli.archive.writer import ArchiveFile, FileOptions, escaping_name


@pytest.mark.parametrize("topic,opts,escapes", [
    ("..", FileOptions(filename_format="<TOPIC>/x.log"), True),            # a valid NSQ topic name
    ("..", FileOptions(), False),                                           # '...host.date.log': inside
    ("events", FileOptions(filename_format="<TOPIC>.<DATETIME>.log", datetime_format="/../../y"), True),
    ("events", FileOptions(filename_format="<HOST>/<TOPIC>.log", host_identifier="../.."), True),
    ("events", FileOptions(filename_format="<TOPIC>/%s.log".replace("%s", "<DATETIME>"),
                           datetime_format="%Y/%m/%d"), False),             # sub-directories by date: fine
])
def test_a_name_that_leaves_the_directory_is_found(topic, opts, escapes):
    assert (escaping_name(topic, opts) is not None) == escapes


def test_the_writer_refuses_such_a_name_as_the_last_guard():
    f = ArchiveFile("..", FileOptions(filename_format="<TOPIC>/x.log"))
    with pytest.raises(OSError, match="leaves --output-dir"):
        f._name(0.0, 0)


def test_the_default_name_is_the_hour_and_a_new_hour_opens_a_new_file(tmp_path):
    """nsq_to_file's default: <TOPIC>.<HOST><REV>.<DATETIME>.log with the UTC hour, so the first
    sync after the hour turns closes the file (reason "datetime") and opens the next hour's at
    <REV> 0. (The to-file tests that count files give a --datetime-format that never turns.)"""
    now = [1795877999.5]  # 2026-11-28 14:59:59.5 UTC
    closed = []
    f = ArchiveFile("events", FileOptions(output_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "work"),
                                          host_identifier="h", gzip=True),
                    clock=lambda: now[0], on_close=lambda path, reason, size, n: closed.append((path.name, reason, n)))
    f.add(b"a\n")
    assert f.sync() == 1 and f.name == "events.h-000000.2026-11-28_14.log.gz"
    now[0] += 1.0  # 15:00:00.5
    f.add(b"b\n")
    assert f.sync() == 1 and f.name == "events.h-000000.2026-11-28_15.log.gz"
    assert closed == [("events.h-000000.2026-11-28_14.log.gz", "datetime", 1)]
    f.close()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["events.h-000000.2026-11-28_14.log.gz",
                                                                     "events.h-000000.2026-11-28_15.log.gz"]
