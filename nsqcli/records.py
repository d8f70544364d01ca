"""Record formats shared by tail, to-file and the archive reader (writing) and mpub (reading): raw,
the NDJSON envelope, and templates of the documented fields (checked at start-up)."""

from __future__ import annotations

import base64
import json
import re
import time


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
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


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


#: what a --format template may name: these fields themselves, nothing reached through them
FIELDS = ("topic", "channel", "nsqd", "id", "attempts", "timestamp", "time", "size", "body", "body_hex",
          "body_escaped")
#: --format's help: the fields a template may name
FORMAT_HELP = ("raw, json (NDJSON envelope), or a template like '{topic} {id} {attempts} {body}'. Fields: "
               "topic, channel, nsqd, id, attempts, timestamp (ns since 1970), time (RFC 3339), size (body bytes), "
               "body (as UTF-8), body_hex (hex digits), body_escaped (one line: \\n, \\t, \\xNN for bytes "
               "that are not printable UTF-8, and \\\\).")
#: values of the fields' types, to try a template's format specs on at start-up
_SAMPLE = {"topic": "t", "channel": "c", "nsqd": "127.0.0.1:4150", "id": "0" * 16, "attempts": 1,
           "timestamp": 0, "time": "1970-01-01T00:00:00.000000000Z", "size": 1, "body": "b", "body_hex": "62",
           "body_escaped": "b"}


def _escape_table(newlines: bool) -> list[bytes]:
    table = []
    for b in range(256):
        c = bytes([b])
        if c == b"\\":
            table.append(b"\\\\" if newlines else c)  # on a terminal a backslash is harmless
        elif c in b"\n\t":
            table.append((b"\\n" if c == b"\n" else b"\\t") if newlines else c)
        elif c == b"\r":
            table.append(b"\\r")
        elif b < 0x20 or b == 0x7F:
            table.append(b"\\x%02x" % b)
        else:
            table.append(c)
    return table


_ESCAPE_ALL, _ESCAPE_CONTROLS = _escape_table(True), _escape_table(False)
_CONTROLS = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def escape_bytes(body: bytes, newlines: bool = True) -> bytes:
    """``body`` with backslash escapes for what is not printable text: control characters
    (C0, DEL, and C1 as UTF-8) and bytes that are not UTF-8 (\\xNN); with ``newlines`` also \\n,
    \\t and the backslash itself (one record, one line, unambiguous). Printable UTF-8 stays as it is."""
    table = _ESCAPE_ALL if newlines else _ESCAPE_CONTROLS
    out = []
    text = body.decode("utf-8", "surrogateescape")
    for ch in text:
        o = ord(ch)
        if o < 0x80:
            out.append(table[o])
        elif 0xDC80 <= o <= 0xDCFF:  # a byte that is not UTF-8
            out.append(b"\\x%02x" % (o - 0xDC00))
        elif 0x80 <= o <= 0x9F:  # C1 controls (CSI is 0x9b)
            out.append(b"\\u%04x" % o)
        else:
            out.append(ch.encode("utf-8"))
    return b"".join(out)


def terminal_safe(body: bytes) -> bytes:
    """A raw body as it may reach a terminal: newlines and tabs kept, escape sequences (ESC, BEL,
    other controls, C1, bytes that are not UTF-8) shown as backslash escapes instead of obeyed."""
    if not _CONTROLS.search(body):
        if body.isascii():
            return body
        try:
            body.decode("utf-8")
            return body
        except UnicodeDecodeError:
            pass
    return escape_bytes(body, newlines=False)


class TemplateError(ValueError):
    """A --format that is not raw, json or a template of the documented fields; ``field`` is
    the offending field when there is one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def template_fields(fmt: str) -> list[str]:
    """Every replacement field of ``fmt``, nested ones in format specs included (the ``b`` of
    ``{a:>{b}}``). Raises ValueError for a malformed template."""
    import string

    names = []
    for _, name, spec, _ in string.Formatter().parse(fmt):
        if name is not None:
            names.append(name)
            names += template_fields(spec or "")
    return names


def check_template(fmt: str) -> None:
    """Refuse a template naming anything but the documented fields: no positional ``{}``, no
    attribute access or indexing (``{body.__class__}`` would print Python's internals, and
    longer chains reach module globals), and format specs that fit the fields' types."""
    listed = f"(fields: {', '.join(FIELDS)})"
    try:
        names = template_fields(fmt)
    except ValueError as e:
        raise TemplateError(f"invalid --format template {fmt!r}: {e} {listed}") from None
    for name in names:
        if name not in FIELDS:
            reached = "." in name or "[" in name
            raise TemplateError(f"invalid --format template {fmt!r}: unknown field {name!r} "
                                + ("(a field itself only: no attribute access or indexing) " if reached else "")
                                + listed, name)
    try:
        fmt.format(**_SAMPLE)
    except (ValueError, TypeError) as e:
        raise TemplateError(f"invalid --format template {fmt!r}: {e} {listed}") from None


class Formatter:
    """Turns a message into the bytes of one record (without the record separator)."""

    FIELDS = FIELDS

    def __init__(self, fmt: str, print_topic: bool = False):
        self.fmt = fmt
        self.print_topic = print_topic
        self.hex = self.escaped = False
        if fmt in ("raw", "json"):
            return
        if "{" not in fmt:
            known = fmt.strip().lower() in ("raw", "json")
            raise TemplateError(f"unknown --format {fmt!r}: use raw, json" + (" (lower case)" if known else "")
                                + " or a template with {fields} like '{topic} {id} {body}' "
                                f"(fields: {', '.join(FIELDS)})")
        check_template(fmt)
        names = template_fields(fmt)
        self.hex, self.escaped = "body_hex" in names, "body_escaped" in names

    def many(self, msgs: list) -> list[bytes]:
        """The records of many messages (raw bodies without a look at each: the archiving
        hot path)."""
        if self.fmt == "raw" and not self.print_topic:
            return [m.body for m in msgs]
        return [self(m) for m in msgs]

    def __call__(self, m) -> bytes:
        if self.fmt == "raw":
            return (m.topic.encode() + b" | " + m.body) if self.print_topic else m.body
        if self.fmt == "json":
            return json.dumps(envelope(m), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        fields = {"topic": m.topic, "channel": m.channel, "nsqd": m.nsqd,
                  "id": m.id.decode("ascii", "replace"), "attempts": m.attempts,
                  "timestamp": m.timestamp, "time": rfc3339(m.timestamp), "size": len(m.body),
                  "body": m.body.decode("utf-8", "surrogateescape")}
        if self.hex:
            fields["body_hex"] = m.body.hex()
        if self.escaped:
            fields["body_escaped"] = escape_bytes(m.body, newlines=True).decode("utf-8")  # printable UTF-8 is kept
        return self.fmt.format(**fields).encode("utf-8", "surrogateescape")
