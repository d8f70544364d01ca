"""Crash recovery of archive files (archive/recovery.py)."""

from __future__ import annotations

import gzip


def test_gzip_recovery_trims_torn_member_among_many(tmp_path):
    from nsqcli.archive.recovery import recover, valid_gzip_prefix

    members = [gzip.compress(b"record %d\n" % i) for i in range(20000)]
    whole = b"".join(members)
    assert valid_gzip_prefix(whole) == len(whole)
    assert valid_gzip_prefix(whole + members[5][:-3]) == len(whole)
    assert valid_gzip_prefix(whole + b"garbage") == len(whole)
    assert valid_gzip_prefix(members[0][:10]) == 0
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "t.log.gz").write_bytes(whole + members[7][: len(members[7]) // 2])
    moved = recover(work, out)
    assert [p.name for p in moved] == ["t.log.gz"]
    assert gzip.decompress((out / "t.log.gz").read_bytes()).count(b"\n") == 20000
