"""The nsq source's write-ahead spool: what a task took, on disk before it FINs.

A partition of batch N is a sequence of numbered slots ``<spool>/<epoch>/<N>/<partition>.<k>``.
Each slot is published atomically and exclusively (written under a temporary name, fsynced, then
``os.link``ed to its name, which fails if the name exists), and holds either a chunk of messages
(an Arrow IPC stream) or the END marker (JSON) that closes the partition. So:

- Only the attempt whose link succeeded FINs that chunk's messages; a losing (speculative,
  zombie) attempt REQs its own and reads the winner's slot instead.
- A task run again (a retry, or the batch replayed after a crash) reads the slots already there
  and goes on from the first free one; once a partition has its END marker, every attempt
  returns exactly the same rows. A batch Spark committed has END in every partition.
- ``delete_through(N)`` (the driver, on Spark's commit) removes batches up to N once they are
  older than the retention (msg_timeout + maxReadTime + 30 s): until then a message whose FIN
  was lost and that nsqd delivers again is recognised (take.py) and not taken twice.

A file ``.STOP`` in a batch's directory makes that batch's tasks close their partitions at their
next chunk (``nsqcli to-parquet`` on SIGTERM marks the newest batches): the running batch ends
soon with what it took, as if its read time were up. Batches planned later have directories of
their own, so a marker left behind by a killed stop delays nothing but the batch it was for.

The spool must be on storage every executor reaches (local disk in local mode; a shared mount
on a cluster), like Spark's checkpoint. No pyspark, no sockets.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid

from ..archive.files import fsync_dir as _fsync_dir

END = "end"
STOP = ".STOP"


def _batch_dirs(root: str, newest: int | None = None) -> list[str] | None:
    """The batch directories of every epoch in this spool (the ``newest`` of each epoch);
    None when the spool cannot be read from here."""
    try:
        epochs = os.listdir(root)
    except OSError:
        return None
    return [os.path.join(root, epoch, str(b)) for epoch in epochs
            for b in batches_on_disk(root, epoch)[-newest if newest else 0:]]


def request_stop(root: str, newest: int = 3) -> bool:
    """Mark the ``newest`` batches of every epoch in this spool: their tasks close their
    partitions at their next chunk. False when no batch directory is reachable from here (none
    planned yet, or a Spark Connect client on another machine)."""
    marked = False
    for d in _batch_dirs(root, newest) or ():
        try:
            with open(os.path.join(d, STOP), "wb"):
                marked = True
        except OSError:
            pass
    return marked


def clear_stop(root: str) -> None:
    """Remove every batch's stop marker (to-parquet, once stopped, and when it starts)."""
    for d in _batch_dirs(root) or ():
        try:
            os.unlink(os.path.join(d, STOP))
        except OSError:
            pass


class PartitionSpool:
    def __init__(self, root: str, epoch: str, batch: int, partition: int):
        self.dir = os.path.join(root, epoch, str(batch))
        self.partition = partition

    def path(self, slot: int) -> str:
        return os.path.join(self.dir, f"{self.partition}.{slot}")

    def stop_requested(self) -> bool:
        return os.path.exists(os.path.join(self.dir, STOP))

    def read(self, slot: int):
        """None (free), ``(END, summary dict)`` or ``("data", bytes)``."""
        try:
            with open(self.path(slot), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if data[:1] == b"{":
            return END, json.loads(data)
        return "data", data

    def publish(self, slot: int, data: bytes) -> bool:
        """Make ``data`` slot ``slot``, durably; False if another attempt published it first.
        The batch's directory is made by the driver when it plans the batch (``prepare``), never
        here: an attempt that wakes up after Spark committed the batch and the driver deleted its
        spool fails (FileNotFoundError) instead of FINing into a spool nobody reads."""
        tmp = os.path.join(self.dir, f".{self.partition}.{slot}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError:
            raise  # the batch's directory is gone: committed and deleted (see above)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise OSError(e.errno, f"nsq source: cannot write the spool {self.dir}: {e.strerror} (the "
                                   "messages were given back to nsqd)") from None
        try:
            os.link(tmp, self.path(slot))
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        _fsync_dir(self.dir)
        return True

    def end(self, slot: int, summary: dict) -> bool:
        return self.publish(slot, json.dumps({END: True, **summary}).encode())


def prepare(root: str, epoch: str, batch: int) -> None:
    """The driver, planning ``batch``: its directory, where the tasks publish their slots."""
    os.makedirs(os.path.join(root, epoch, str(batch)), exist_ok=True)


def batches_on_disk(root: str, epoch: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(root, epoch))
    except OSError:  # none, or not a directory
        return []
    return sorted(int(n) for n in names if n.isdigit())


def delete_through(root: str, epoch: str, batch: int, min_age) -> int:
    """Remove the spools of batches <= ``batch`` (Spark committed them) once they are at least
    ``min_age(summaries)`` seconds old (a redelivery whose FIN was lost is recognised until
    then); how many."""
    import time

    gone, now = 0, time.time()
    for b in batches_on_disk(root, epoch):
        path = os.path.join(root, epoch, str(b))
        if b <= batch:
            try:
                if now - os.stat(path).st_mtime < min_age(summaries(root, epoch, b)):
                    continue
            except FileNotFoundError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            gone += 1
    return gone


def summaries(root: str, epoch: str, batch: int) -> list[dict]:
    """The END markers of one batch (rows taken, oldest message) - the source's metrics."""
    out = []
    d = os.path.join(root, epoch, str(batch))
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return out
    for n in names:
        if n.startswith("."):
            continue
        try:
            with open(os.path.join(d, n), "rb") as f:
                head = f.read(1)
                if head == b"{":
                    out.append(json.loads(head + f.read()))
        except (OSError, ValueError):
            continue
    return out
