"""The publish ledger: the one place that counts what nsqd acknowledged.

Every message a publisher takes from its source is in exactly one batch, and every batch is in
one state:

    taken  ->  sent (a future waits for nsqd's answer)  ->  acknowledged   (leaves the ledger)
                 |  E_BAD_BODY / E_BAD_MESSAGE: split in two, both halves wait to be sent
                 |  connection lost, E_*_FAILED: back to unsent, resent in order
                 +- a single message refused: failed (the publish stops; the error names it)

nsqd answers the commands of one connection in order and a batch is only ever sent after every
batch before it (a resend resends all of them, in order), so the acknowledged messages are
always a prefix of what was taken: ``acked`` is that prefix's length, exactly - the number a
resume hint (``mpub --skip``) needs. Nothing else in nsqcli counts publishes.

Pure bookkeeping: no sockets, threads or clocks. Futures are whatever the connection resolves
(``done()``, ``result(timeout)``); the driver (nsqcli.client.publish_iter) waits on them.
"""

from __future__ import annotations

import collections

from ..protocol.commands import encode_mpub_checked, mpub_size


class Entry:
    """One batch: ``count`` messages from message number ``start`` (0-based, in source
    order) of ``topic``. ``batch`` is a list of bodies or a publish_iter.Framed."""

    __slots__ = ("start", "count", "nbytes", "batch", "topic", "future", "address", "lens")

    def __init__(self, start: int, count: int, nbytes: int, batch, topic: str, lens=None):
        self.start = start
        self.count = count
        self.nbytes = nbytes      # the MPUB body size: 4 + sum(4 + len(body))
        self.batch = batch
        self.topic = topic
        self.future = None        # set when sent; None while waiting to be (re)sent
        self.address: str | None = None
        self.lens = lens          # len() of each body when the batching measured them

    def command(self) -> bytes:
        batch = self.batch
        if type(batch) is list:  # the producer's batching checked every body and the topic
            return encode_mpub_checked(self.topic, batch, self.nbytes, self.lens)
        return batch.command()

    def bodies(self) -> list[bytes]:
        return self.batch if type(self.batch) is list else self.batch.bodies()

    def __repr__(self) -> str:
        return f"<Entry {self.start}+{self.count} {self.nbytes}B {'sent' if self.future else 'unsent'}>"


class Ledger:
    """Batches not yet acknowledged, in source order, and the exact acknowledged prefix."""

    def __init__(self):
        self.taken = 0        # messages taken from the source
        self.acked = 0        # the first ``acked`` messages are acknowledged, and no other
        self.batches = 0      # acknowledged MPUB/PUB/DPUB commands
        self.splits = 0       # batches split after nsqd refused them as too big
        self.entries: collections.deque[Entry] = collections.deque()

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def outstanding(self) -> int:
        """Messages taken and not acknowledged."""
        return self.taken - self.acked

    def take(self, batch, count: int, nbytes: int, topic: str, lens=None) -> Entry:
        entry = Entry(self.taken, count, nbytes, batch, topic, lens)
        self.entries.append(entry)
        self.taken += count
        return entry

    def head(self) -> Entry:
        return self.entries[0]

    def ack_head(self) -> Entry:
        """nsqd said OK to the oldest batch."""
        entry = self.entries.popleft()
        self.acked += entry.count
        self.batches += 1
        return entry

    def unsend_all(self) -> list[Entry]:
        """Every batch goes back to unsent (its connection is gone); returned in order."""
        for entry in self.entries:
            entry.future = None
            entry.address = None
        return list(self.entries)

    def split_head(self, limit: int | None = None) -> None:
        """The head batch was refused as too big: replace it by its two halves (or, with
        ``limit``, by pieces whose MPUB body fits in ``limit`` bytes, at least two)."""
        head = self.entries.popleft()
        bodies = head.bodies()
        if len(bodies) < 2:
            self.entries.appendleft(head)
            raise ValueError("a batch of one message cannot be split")
        pieces = fit(bodies, limit) if limit else []
        if len(pieces) < 2:
            half = len(bodies) // 2
            pieces = [bodies[:half], bodies[half:]]
        start = head.start + head.count
        for piece in reversed(pieces):
            start -= len(piece)
            self.entries.appendleft(Entry(start, len(piece), mpub_size(piece), piece, head.topic))
        self.splits += 1

    def refit(self, limit: int) -> None:
        """Unsent batches over ``limit`` bytes are split to fit (nsqd's body limit was learned
        from a refusal); the order of messages does not change."""
        out: collections.deque[Entry] = collections.deque()
        for entry in self.entries:
            if entry.future is not None or entry.nbytes <= limit or entry.count < 2:
                out.append(entry)
                continue
            start = entry.start
            for piece in fit(entry.bodies(), limit):
                out.append(Entry(start, len(piece), mpub_size(piece), piece, entry.topic))
                start += len(piece)
        self.entries = out


def fit(bodies: list[bytes], limit: int) -> list[list[bytes]]:
    """Bodies in order, grouped so that each group's MPUB body is at most ``limit`` bytes (a
    body too big on its own is a group of one)."""
    out: list[list[bytes]] = []
    cur: list[bytes] = []
    size = 4
    for body in bodies:
        n = 4 + len(body)
        if cur and size + n > limit:
            out.append(cur)
            cur, size = [], 4
        cur.append(body)
        size += n
    if cur:
        out.append(cur)
    return out
