"""The archiver's log lines and counts against a real nsqd, in-process: why each file closed,
SIGHUP's line, a topic disappearing while busy (WARNING) or idle (INFO), counts that survive
a topic removed and found again, totals() for the metrics."""

import logging

from tests.support.helpers import http_post, topic_stats, wait_for

from nsqcli.archive.archiver import Archiver
from nsqcli.archive.writer import FileOptions
from nsqcli.client.config import Config


def archiver(nsqd, topic, tmp_path, **opts):
    return Archiver(topics=[topic], topic_pattern=None, topic_refresh=60, channel="c",
                    opts=FileOptions(output_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "work"),
                                     filename_format="<TOPIC><REV>.log", **opts),
                    formatter=lambda msgs: b"".join(m.body + b"\n" for m in msgs), config=Config(max_in_flight=50),
                    nsqd=[nsqd.tcp_address], lookupd=[], sync_interval=0.1)


def events(caplog, name):
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def pub(nsqd, topic, n, start=0):
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%05d" % i for i in range(start, start + n)), topic=topic)


def test_each_close_says_why_and_sighup_says_it_came(nsqd, topic, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nsqcli")
    a = archiver(nsqd, topic, tmp_path, rotate_size=400).start()
    try:
        pub(nsqd, topic, 100)  # 700 bytes: rotated by size at least once
        wait_for(lambda: a.status()[0]["finished"] == 100, what="archived")
        wait_for(lambda: any(r.fields["reason"] == "size" for r in events(caplog, "file_closed")), what="size rotation")
        pub(nsqd, topic, 10, 100)
        wait_for(lambda: a.status()[0]["finished"] == 110, what="archived")
        a.hup_event.set()
        wait_for(lambda: events(caplog, "sighup"), what="SIGHUP handled")
        wait_for(lambda: any(r.fields["reason"] == "sighup" for r in events(caplog, "file_closed")), what="closed")
    finally:
        a.stop()
    (hup,) = events(caplog, "sighup")
    assert hup.getMessage() == "SIGHUP: closing and moving 1 file" and hup.fields == {"files": 1}
    closed = events(caplog, "file_closed")
    out = sorted((tmp_path / "out").iterdir())
    assert len(closed) == len(out) and sorted(r.fields["path"] for r in closed) == [str(p) for p in out]
    assert sum(r.fields["records"] for r in closed) == 110  # every record in exactly one closed file
    assert all(r.fields["bytes"] == (tmp_path / "out" / r.fields["path"]).stat().st_size for r in closed)
    size = [r for r in closed if r.fields["reason"] == "size"]
    assert size and all(r.getMessage().endswith(f"(--rotate-size reached; {r.fields['bytes']} bytes, "
                                                f"{r.fields['records']} records)") for r in size)
    hup_closed = [r for r in closed if r.fields["reason"] == "sighup"]
    assert len(hup_closed) == 1 and "(SIGHUP; " in hup_closed[0].getMessage()
    t = a.totals()
    assert t["files_rotated"] == len(out) and t["bytes_written"] == sum(p.stat().st_size for p in out)
    assert t["fsyncs"] >= 2 and t["last_fsync"] and t["write_errors"] == 0


def test_counts_go_on_after_a_topic_is_removed_and_found_again(nsqd, topic, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nsqcli")
    a = archiver(nsqd, topic, tmp_path).start()
    try:
        pub(nsqd, topic, 30)
        wait_for(lambda: a.status()[0]["finished"] == 30, what="archived")
        a._remove_topic(topic)  # as a --topic-pattern refresh does when no lookupd lists it
        (gone,) = events(caplog, "topic_removed")
        # a message a moment ago: said as a WARNING, with what is known
        assert gone.levelno == logging.WARNING and gone.fields["busy"] and gone.fields["received"] == 30
        assert gone.getMessage().startswith(f"topic {topic} disappeared (no nsqlookupd lists a producer for it): "
                                            "unsubscribed, file closed, while it was receiving messages (last message ")
        (row,) = a.status()
        assert not row["active"] and row["received"] == row["finished"] == 30 and row["closed"] == 1
        pub(nsqd, topic, 20, 30)
        a._add_topic(topic, fail_fast=True)
        wait_for(lambda: a.status()[0]["finished"] == 50, what="archived after the re-subscribe")
        (row,) = a.status()
        assert row["active"] and row["received"] == 50 and row["closed"] == 1
        assert events(caplog, "topic_added")[-1].getMessage() == f"archiving topic {topic} again"
    finally:
        a.stop()
    (row,) = a.status()
    files = sorted((tmp_path / "out").iterdir())
    assert row["closed"] == len(files) == 2 and row["bytes_written"] == sum(f.stat().st_size for f in files)
    assert topic_stats(nsqd, topic)["channels"][0]["depth"] == 0


def test_an_idle_topic_disappearing_is_info(nsqd, topic, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nsqcli")
    a = archiver(nsqd, topic, tmp_path)
    a.topic_refresh = 0.0  # the "recently busy" window is its minimum (10 s): nothing received at all
    a.start()
    try:
        wait_for(lambda: a.topics[topic].consumer.connections, what="subscribed")
        a._remove_topic(topic)
    finally:
        a.stop()
    (gone,) = events(caplog, "topic_removed")
    assert gone.levelno == logging.INFO and gone.getMessage().endswith("file closed (no message received, 0 archived "
                                                                      "by this subscription)")


def test_a_topic_said_archiving_is_said_stopped_even_if_an_interrupt_marks_it_late(nsqd, topic, tmp_path, caplog):
    """interrupt() reads a topic's `started` and then marks it cut short: when the topic's start
    returned in between, "archiving topic" was said and the mark came after. Its summary line is
    still said (review: it was left out, a topic said started and never said stopped)."""
    caplog.set_level(logging.INFO, logger="nsqcli")
    a = archiver(nsqd, topic, tmp_path).start()
    try:
        assert [r.getMessage() for r in events(caplog, "topic_added")] == [f"archiving topic {topic}"]
        a.topics[topic].cut_short = True  # the late mark of an interrupt() that looked before the start returned
    finally:
        a.stop()
    (stopped,) = events(caplog, "topic_stopped")
    assert stopped.fields["topic"] == topic and stopped.fields["finished"] == 0
