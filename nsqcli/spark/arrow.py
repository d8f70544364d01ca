"""Arrow record batches into NSQ commands, with no Python object per message on the hot path.

An MPUB payload is ``[count]([size][body])*``. For a column of bodies, pyarrow builds the
``[size][body]`` elements in one vectorised join (the 4-byte big-endian sizes come from the
length column, byte-swapped in C by ``array``); the concatenated data buffer of the result IS the
framed payload, so a batch of messages is a zero-copy slice of it. Only the per-batch split points
(a handful of binary searches over the offsets) run in Python.

Columns: ``body`` (binary or string, required), ``topic`` (string, optional: per-row routing),
``defer_ms`` (integer, optional: rows with a positive value go out one by one as DPUB).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..client.producer import Framed
from ..errors import NSQError
from ..protocol import validate_topic
from .options import OptionError


class RowError(ValueError):
    """A row that cannot be published (null or empty body, over max_msg_size, bad topic)."""


# Kafka's sink columns: NSQ has no place for them, and ignoring them would lose data quietly
KAFKA_COLUMNS = {
    "value": "column 'value' is Kafka's message: the nsq sink publishes column 'body'; rename it "
             "(.withColumnRenamed('value', 'body'))",
    **{c: f"column {c!r} is Kafka's: NSQ messages have only a body; put it into the body "
          "(e.g. to_json(struct(...)) as body) or drop it" for c in ("key", "headers", "partition")},
}


def check_schema(fields: dict[str, str], default_topic: str | None) -> None:
    """``fields``: column name -> Spark simple type name ("binary", "string", "bigint"...).
    Raises OptionError with a clear message before any task runs. Columns other than body,
    topic and defer_ms are ignored (the source's id, timestamp... may come along), except
    Kafka's key, value, headers and partition."""
    kafka = [KAFKA_COLUMNS[c] for c in fields if c in KAFKA_COLUMNS]
    body = fields.get("body")
    if body is None:
        missing = "the DataFrame has no 'body' column (binary or string); columns: " + ", ".join(fields) \
            if fields else "the DataFrame has no columns"
        raise OptionError("; ".join([missing] + kafka))
    if kafka:
        raise OptionError("; ".join(kafka))
    if body not in ("binary", "string"):
        raise OptionError(f"column 'body' must be binary or string, not {body}")
    topic = fields.get("topic")
    if topic is not None and topic != "string":
        raise OptionError(f"column 'topic' must be a string, not {topic}")
    if topic is None and not default_topic:
        raise OptionError("give option 'topic' or a 'topic' column")
    defer = fields.get("defer_ms")
    if defer is not None and defer not in ("tinyint", "smallint", "int", "bigint", "byte", "short",
                                           "integer", "long"):
        raise OptionError(f"column 'defer_ms' must be an integer, not {defer}")


def _int32s(arr: pa.Array, extra: int = 0) -> array:
    """The int32 buffer of an arrow array as a C array, from its offset, ``len + extra``
    entries (``extra=1`` for the offsets buffer of a binary array)."""
    a = array("i")
    buf = arr.buffers()[1]
    a.frombytes(memoryview(buf)[arr.offset * 4:(arr.offset + len(arr) + extra) * 4])
    return a


def frame_elements(body: pa.Array) -> pa.Array:
    """Each body prefixed with its 4-byte big-endian size (binary array, offset 0)."""
    lengths = pc.binary_length(body)
    sizes = _int32s(lengths.cast(pa.int32()))
    if sys.byteorder == "little":
        sizes.byteswap()
    prefix = pa.Array.from_buffers(pa.binary(4), len(body), [None, pa.py_buffer(sizes)])
    return pc.binary_join_element_wise(prefix.cast(pa.binary()), body, b"")


class Framer:
    """Turns record batches into :class:`Framed` MPUB/DPUB batches under the size limits."""

    def __init__(self, default_topic: str | None, batch_size: int, max_body_size: int, max_msg_size: int):
        self.default_topic = default_topic
        self.batch_size = max(1, batch_size)
        self.max_body_size = max_body_size
        self.max_msg_size = max_msg_size
        self.rows = 0           # rows seen (for error messages: "row N of this partition")
        self.bytes = 0          # body bytes framed
        self._topics: set[str] = set()

    def frames(self, batches: Iterable[pa.RecordBatch]) -> Iterator[Framed]:
        for rb in batches:
            if rb.num_rows:
                yield from self._batch(rb)
                self.rows += rb.num_rows

    # -- one record batch ----------------------------------------------------------------------
    def _batch(self, rb: pa.RecordBatch) -> Iterator[Framed]:
        names = rb.schema.names
        body = rb.column(names.index("body"))
        body = body.cast(pa.binary()) if body.type != pa.binary() else body
        self._check_bodies(body)
        topic_col = rb.column(names.index("topic")) if "topic" in names else None
        defer_col = rb.column(names.index("defer_ms")) if "defer_ms" in names else None
        if topic_col is None:
            groups = [(self._topic(self.default_topic), body, defer_col)]
        else:
            groups = self._by_topic(topic_col, body, defer_col)
        for topic, b, d in groups:
            if d is not None and d.null_count < len(d):
                deferred = pc.fill_null(pc.greater(d, 0), False)
                if pc.any(deferred).as_py():
                    yield from self._dpubs(topic, b.filter(deferred), d.filter(deferred))
                    b = b.filter(pc.invert(deferred))
            if len(b):
                yield from self._mpubs(topic, b)

    def _check_bodies(self, body: pa.Array) -> None:
        if body.null_count:
            i = pc.index(pc.is_null(body), True).as_py()
            raise RowError(f"row {self.rows + i + 1} of this partition has a null body")
        lengths = pc.binary_length(body)
        mm = pc.min_max(lengths).as_py()
        if mm["min"] == 0:
            i = pc.index(lengths, 0).as_py()
            raise RowError(f"row {self.rows + i + 1} of this partition has an empty body (nsqd refuses empty messages)")
        if mm["max"] > self.max_msg_size:
            i = pc.index(pc.greater(lengths, self.max_msg_size), True).as_py()
            raise RowError(f"row {self.rows + i + 1} of this partition is {mm['max']} bytes, over the "
                           f"{self.max_msg_size}-byte max message size")
        self.bytes += pc.sum(lengths).as_py() or 0

    def _topic(self, topic: str | None) -> str:
        if topic is None:
            raise RowError("a row has a null 'topic' and no option 'topic' was given")
        if topic not in self._topics:
            try:
                validate_topic(topic)
            except NSQError as e:
                raise RowError(f"column 'topic': {e}") from None
            self._topics.add(topic)
        return topic

    def _by_topic(self, topic_col: pa.Array, body: pa.Array, defer_col):
        if topic_col.null_count:
            if self.default_topic is None:
                self._topic(None)
            topic_col = pc.fill_null(topic_col, self.default_topic)
        names = pc.unique(topic_col).to_pylist()
        if len(names) == 1:
            return [(self._topic(names[0]), body, defer_col)]
        out = []
        for name in names:
            mask = pc.equal(topic_col, name)
            out.append((self._topic(name), body.filter(mask), None if defer_col is None else defer_col.filter(mask)))
        return out

    def _mpubs(self, topic: str, body: pa.Array) -> Iterator[Framed]:
        framed = frame_elements(body)
        offsets = _int32s(framed, extra=1)
        data = framed.buffers()[2]
        n = len(body)
        limit = self.max_body_size - 4      # the MPUB body: [count] + framed elements
        i = 0
        while i < n:
            hi = min(n, i + self.batch_size)
            j = bisect_right(offsets, offsets[i] + limit, i + 1, hi + 1) - 1
            j = max(j, i + 1)  # one message always fits (checked against max_msg_size)
            yield Framed(topic, memoryview(data)[offsets[i]:offsets[j]], j - i)
            i = j

    def _dpubs(self, topic: str, body: pa.Array, defer: pa.Array) -> Iterator[Framed]:
        framed = frame_elements(body)
        offsets = _int32s(framed, extra=1)
        data = memoryview(framed.buffers()[2])
        for k, ms in enumerate(defer.to_pylist()):
            yield Framed(topic, data[offsets[k]:offsets[k + 1]], 1, defer_ms=int(ms))
