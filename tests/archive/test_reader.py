"""Reading archives back (archive/reader.py), from nsqcli to-file and nsq_to_file."""

from __future__ import annotations

import gzip


def test_read_archive_stops_at_a_torn_gzip_member(tmp_path):

    from nsqcli.archive.reader import read_archive

    whole = gzip.compress(b"a\nb\n") + gzip.compress(b"c\n")
    (tmp_path / "x.log.gz").write_bytes(whole + gzip.compress(b"d\ne\n")[:-6])
    errors = []
    assert [r.body for r in read_archive([tmp_path], on_error=errors.append)] == [b"a", b"b", b"c"]
    assert errors and "torn gzip member" in errors[0]
    (tmp_path / "x.log.gz").write_bytes(whole + b"\x1f\x8b\x08garbage")
    errors.clear()
    assert [r.body for r in read_archive([tmp_path / "x.log.gz"], on_error=errors.append)] == [b"a", b"b", b"c"]
    assert errors and "corrupt gzip data" in errors[0]
