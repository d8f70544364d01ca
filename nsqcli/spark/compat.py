"""What the nsq source needs from Spark that Spark 4.0 and 4.1 do not give it.

Spark 4.2 calls ``latestOffset(start, limit)``: ``start`` is where the last batch ended. Spark 4.0
and 4.1 call ``latestOffset()``. The source plans each batch from the last one's end (its batch
number and epoch), so on those versions it keeps that end itself: Spark calls
``partitions(start, end)`` only after it wrote ``end`` to the query's offset log, so the ``end`` of
the last ``partitions`` call is the end of the newest batch Spark knows - the ``start`` Spark 4.2
would pass. It is kept in memory, and written (atomically) to ``<spoolLocation>/planned.json`` for
a driver restarted from the checkpoint whose newest batch had committed (Spark then runs nothing
before asking for the next offset). A batch Spark runs again after a restart calls ``partitions``
with its own end first, so the file never runs ahead of the checkpoint. No pyspark here.
"""

from __future__ import annotations

import json
import os

FILE = "planned.json"


class Planned:
    def __init__(self, spool: str, needed: bool):
        self.spool, self.needed = spool, needed
        self._end: dict | None = None

    def seen(self, end: dict) -> None:
        """Spark planned a batch ending at ``end`` (an empty range repeats the last one)."""
        if end == self._end:
            return
        self._end = end
        os.makedirs(self.spool, exist_ok=True)
        path = os.path.join(self.spool, FILE)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(end, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def last(self, epoch: str | None) -> dict | None:
        """The end of the newest batch Spark planned (of ``epoch`` if this process knows it);
        None for a new query. Spark 4.0 asks a new query for its latest offset before its initial
        one, so None also covers a planned.json lost with its spool: the query then goes on in a
        new epoch (its own spool directories), exactly as well."""
        if self._end is None:
            try:
                with open(os.path.join(self.spool, FILE)) as f:
                    self._end = json.load(f)
            except (FileNotFoundError, ValueError):
                pass
        if self._end is not None and (epoch is None or self._end.get("epoch") == epoch):
            return self._end
        return None
