"""to-nsq's Copier (nsqcli/relay/copier.py) on its own: what it FINs and counts for what the
destination acknowledged (the runs against real nsqd: tests/cli/test_to_nsq.py)."""

from __future__ import annotations

import threading

import pytest

from nsqcli.client.producer import PublishResult
from nsqcli.relay.copier import Copier, DestinationError


class _Msg:
    def __init__(self, body, topic="t"):
        self.body, self.topic, self.attempts, self.id = body, topic, 1, b"0123456789abcdef"
        self.answer = None

    def requeue(self, delay=None, backoff=True):
        self.answer = "REQ"

    def finish(self):
        self.answer = "FIN"


def test_a_batch_is_fined_only_when_the_destination_acknowledged_all_of_it():
    """multi_publish's PublishResult decides: fewer acknowledged than sent raises (the consumer
    requeues the batch) and nothing is counted as copied."""
    class Producer:
        def __init__(self, acked):
            self.acked = acked

        def multi_publish(self, topic, bodies):
            return PublishResult(min(self.acked, len(bodies)), 1, ["dst:4150"])

    msgs = [_Msg(b"a"), _Msg(b"b"), _Msg(b"c")]
    copier = Copier(Producer(2), None, "hostpool", None, (), None, 0, threading.Event())
    with pytest.raises(DestinationError, match="acknowledged 2 of 3"):
        copier(msgs)
    assert copier.copied == 0 and copier.failed_batches == 1 and copier.active == 0
    copier = Copier(Producer(3), None, "hostpool", None, (), None, 0, threading.Event())
    copier(msgs)
    assert copier.copied == 3 and copier.wait_idle(0)


def test_what_the_destination_acknowledged_before_a_failure_is_fined_and_counted():
    """A publish failing part-way (PublishError.published: the first N, in order): those N are
    FINed and counted, the rest left to the consumer to requeue (they came again as duplicates);
    with --mode fanout none (copied means every destination has it)."""
    from nsqcli.errors import PublishError, TransportError

    class Producer:
        def multi_publish(self, topic, bodies):
            raise PublishError("connection lost", 2, len(bodies) - 2, TransportError("lost"))

    for mode, fined in (("hostpool", 2), ("fanout", 0)):
        msgs = [_Msg(b"a"), _Msg(b"b"), _Msg(b"c"), _Msg(b"d")]
        copier = Copier(Producer(), None, mode, None, (), None, 0, threading.Event())
        with pytest.raises(DestinationError, match="connection lost"):
            copier(msgs)
        assert [m.answer for m in msgs] == ["FIN"] * fined + [None] * (4 - fined), mode
        assert copier.copied == fined and copier.failed_batches == 1
