"""What issue 37's refactor of mpub's bookkeeping (f970c01: the producer's ledger and
RecordNumbers for Pending) must not have changed, found by comparing it with 6ae9607."""

import collections
import io
import re


class _NoRun:
    publishing = None  # no publish_iter in progress: nothing unanswered


class _App:
    def warn(self, line):
        pass


def test_a_forced_exit_while_an_ok_is_being_counted_still_says_where_to_resume():
    """A second Ctrl-C forces the exit from a signal handler, which runs between any two
    bytecodes of the main thread - also inside BodyReader.on_progress, while it counts an OK. Its
    lines (mpub._forced_lines) must still come out whole: GracefulStop swallows an exception there
    and exits with no summary and no --skip at all. Here the handler runs at the one point where
    on_progress forgets the acknowledged runs (the old Pending popped them there too): with
    RecordNumbers forgotten before ``acked`` moved, resume_at looked up a forgotten message and
    raised IndexError."""
    from nsqcli.cli.commands import mpub as M

    stats = M.Tally()
    records = M.BodyReader(_App(), [io.BytesIO(b"a\nb\nc\nd\n")], b"\n", "raw", 0, False, None, stats)
    handed = sum(len(group) for group in records)  # one chunk: records 1-4, one run
    assert handed == 4
    seen = []

    class SignalAfterPop(collections.deque):
        def popleft(self):
            item = super().popleft()
            seen.append(M._forced_lines(stats, records, _NoRun()))  # the forced exit's handler
            return item

    numbers = getattr(records, "numbers", None) or records.unacked  # (6ae9607: Pending)
    numbers.runs = SignalAfterPop(numbers.runs)
    records.on_progress(4)  # nsqd acknowledged all four
    assert seen, "the runs were not forgotten: the test no longer reaches the window"
    summary, where = seen[0]
    m = re.fullmatch(r"nsqd acknowledged (\d+) records in this run; resume with --skip (\d+)", where)
    assert m, where
    # resuming loses nothing (every record up to --skip is acknowledged) and the line and the
    # summary agree with each other
    assert int(m[2]) <= 4
    published = int(re.match(r"published (\d+),", summary)[1])
    assert published == int(m[1])
    assert records.where() == "nsqd acknowledged 4 records in this run; resume with --skip 4"
