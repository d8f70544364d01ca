"""Record formats shared by tail (writing) and mpub (reading): raw, NDJSON envelope, templates."""

from __future__ import annotations

import base64
import datetime as _dt
import json


def split_records(chunks, delimiter: bytes = b"\n"):
    """Records from a stream of byte chunks split anywhere: separated by ``delimiter``; a last
    record without one is kept whole; empty records are yielded as b""."""
    rest = b""
    for chunk in chunks:
        parts = (rest + chunk).split(delimiter)
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def rfc3339(ns: int) -> str:
    secs, frac = divmod(ns, 1_000_000_000)
    t = _dt.datetime.fromtimestamp(secs, _dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def envelope(m) -> dict:
    """The NDJSON envelope (tail --format json, to-file --format json, mpub --format json)."""
    d = {"topic": m.topic, "channel": m.channel, "nsqd": m.nsqd, "id": m.id.decode("ascii", "replace"),
         "timestamp": m.timestamp, "time": rfc3339(m.timestamp), "attempts": m.attempts}
    try:
        d["body"] = m.body.decode("utf-8")
    except UnicodeDecodeError:
        d["body_base64"] = base64.b64encode(m.body).decode("ascii")
    return d


def envelope_body(line: bytes) -> bytes:
    """The message body inside one NDJSON envelope line."""
    d = json.loads(line)
    if "body_base64" in d:
        return base64.b64decode(d["body_base64"], validate=True)
    if "body" in d:
        return d["body"].encode("utf-8")
    raise ValueError("record has neither 'body' nor 'body_base64'")


class Formatter:
    """Turns a message into the bytes of one record (without the record separator)."""

    FIELDS = ("topic", "channel", "nsqd", "id", "attempts", "timestamp", "time", "body")

    def __init__(self, fmt: str, print_topic: bool = False):
        self.fmt = fmt
        self.print_topic = print_topic
        if fmt not in ("raw", "json"):
            if "{" not in fmt:
                known = fmt.strip().lower() in ("raw", "json")
                raise ValueError(f"unknown --format {fmt!r}: use raw, json" + (" (lower case)" if known else "")
                                 + " or a template with {fields} like '{topic} {id} {body}' "
                                 f"(fields: {', '.join(self.FIELDS)})")
            try:
                fmt.format(**{k: "" for k in self.FIELDS})
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"invalid --format template {fmt!r}: unknown field {e} "
                                 f"(fields: {', '.join(self.FIELDS)})") from None

    def __call__(self, m) -> bytes:
        if self.fmt == "raw":
            return (m.topic.encode() + b" | " + m.body) if self.print_topic else m.body
        if self.fmt == "json":
            return json.dumps(envelope(m), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        fields = {"topic": m.topic, "channel": m.channel, "nsqd": m.nsqd,
                  "id": m.id.decode("ascii", "replace"), "attempts": m.attempts,
                  "timestamp": m.timestamp, "time": rfc3339(m.timestamp),
                  "body": m.body.decode("utf-8", "surrogateescape")}
        return self.fmt.format(**fields).encode("utf-8", "surrogateescape")
