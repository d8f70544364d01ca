"""What the nsq source needs from Spark that Spark 4.0 and 4.1 do not give it.

Spark 4.2 calls ``latestOffset(start, limit)``: ``start`` is where the last batch ended. Spark 4.0
and 4.1 call ``latestOffset()``. The source plans each batch from the last one's end (its batch
number and epoch), so on those versions it keeps that end itself, from ``partitions(start, end)``:

- Spark calls ``partitions`` for a batch only after it wrote ``end`` to the query's offset log,
  so the ``end`` of the last call is the end of the newest batch Spark knows: the ``start`` 4.2
  would pass.
- A query restarted from its checkpoint calls ``partitions`` before asking for an offset: with
  the uncommitted batch's range when it runs that batch again, else with the empty range
  ``(end, end)`` of its newest batch (observed on pyspark 4.0.5 and 4.1.4).
- A new query asks for its latest offset before its initial one: nothing is known, and the
  query starts a new epoch.

Kept in this process's memory only: nothing on disk can be mistaken for another query's.
"""

from __future__ import annotations


class Planned:
    def __init__(self, needed: bool):
        self.needed = needed
        self._end: dict | None = None

    def seen(self, end: dict) -> None:
        """Spark planned (or, restarting, reports) a batch ending at ``end``."""
        self._end = end

    def last(self, epoch: str | None) -> dict | None:
        """The end of the newest batch Spark planned; None for a new query."""
        if self._end is not None and (epoch is None or self._end.get("epoch") == epoch):
            return self._end
        return None
