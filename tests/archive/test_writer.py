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
