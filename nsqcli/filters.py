"""Message filters of tail and to-file: ``--grep REGEX`` (searched in the body's bytes) and
``--where EXPR``, a small expression language on the JSON body's fields and on the message's own
fields. Pure: no sockets, threads or clocks; compiled once at start-up (a mistake is a usage
error naming where it is), evaluated per message.

Why RE2 (google-re2) and not Python's ``re`` for --grep and ``=~``: RE2 matches in time linear in
the body, so no pattern can hang a consumer. With ``re``, ``(a+)+$`` on a body of 30 "a" and a
"!" backtracks for minutes while holding the GIL, where neither SIGTERM nor --timeout can stop it.
RE2 is also the syntax of Go's regexp, which NSQ's own tools use; it has no lookaround and no
backreferences (refused at start-up, named). --grep matches bytes (the pattern's UTF-8 bytes, each
byte one character, as Python's ``re`` does on bytes); ``=~`` matches text.

Why a language of our own and not Python's ``eval``: the expression comes from a command line
or a unit file and must not be able to run code; and its paths are jq's (``.user.id``,
``.items[0]``), which NSQ users already type to look at JSON bodies.

The grammar (WHERE_HELP says it to users)::

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := value [("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not in" | "=~") value]
    value   := path | field | string | number | true | false | null | list | "(" expr ")"
    path    := "." | "." name ("." name | "[" integer "]" | "[" string "]")*
    field   := id | attempts | size | timestamp | time | topic | channel | nsqd

A path into a body that is not JSON, or that is not there, is null; an ordering comparison with
null or between a string and a number is false (never an error per message).
"""

from __future__ import annotations

import json
import re

from .records import rfc3339

#: the message's own fields a --where expression may name
MESSAGE_FIELDS = ("id", "attempts", "size", "timestamp", "time", "topic", "channel", "nsqd")

WHERE_HELP = ("Only messages for which EXPR is true, e.g. '.user.id == 42 and attempts > 1', "
              "'size < 1000', '.type in [\"a\",\"b\"]', '.name =~ \"^ab\"'. Paths into the JSON body are "
              "jq's (.a.b, .items[0], .[\"odd key\"]; null when missing or not JSON); message fields: "
              + ", ".join(MESSAGE_FIELDS) + " (timestamp: ns since 1970; time: RFC 3339 text); operators: "
              "== != < <= > >= in, not in, =~ (RE2 regex), and, or, not, ( ). A small language of its own, "
              "not Python: nothing in it can run code.")


class FilterError(ValueError):
    """A --grep or --where that cannot be compiled; ``option`` names which."""

    def __init__(self, message: str, option: str):
        super().__init__(message)
        self.option = option


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>-?(?:\d+\.\d*|\.\d+(?![A-Za-z_])|\d+)(?:[eE][-+]?\d+)?)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>==|!=|<=|>=|=~|<|>|\(|\)|\[|\]|,|\.)
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*)
""", re.VERBOSE)

_MISSING = object()
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _tokens(text: str) -> list[tuple[str, object, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _err(text, pos, f"unexpected {text[pos]!r}")
        kind = m.lastgroup
        if kind == "num":
            s = m.group()
            out.append(("value", float(s) if any(c in s for c in ".eE") else int(s), pos))
        elif kind == "str":
            s = m.group()
            value = _unquote(s)
            if value is None:
                raise _err(text, pos, f"bad escape in string {s} (strings take JSON's escapes: a regular "
                           "expression's \\d is written \\\\d)")
            out.append(("value", value, pos))
        elif kind != "ws":
            out.append((kind, m.group(), pos))
        pos = m.end()
    out.append(("end", None, len(text)))
    return out


_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "/": "/", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def _unquote(s: str) -> str | None:
    """The text of a quoted string token ('...' or "...", JSON's escapes); None for a bad escape."""
    out, i, body = [], 0, s[1:-1]
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1:i + 2]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2:i + 6]):
            out.append(chr(int(body[i + 2:i + 6], 16)))
            i += 6
        else:
            return None
    return "".join(out)


def _err(text: str, pos: int, why: str) -> FilterError:
    return FilterError(f"invalid --where {text!r}: {why} at position {pos + 1}", "--where")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, kind: str, value=None) -> bool:
        k, v, _ = self.toks[self.i]
        return k == kind and (value is None or v == value)

    def take(self):
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, kind: str, value: str) -> None:
        if not self.peek(kind, value):
            k, v, pos = self.toks[self.i]
            raise _err(self.text, pos, f"expected {value!r}, found " + ("the end" if k == "end" else repr(v)))
        self.i += 1

    def parse(self):
        f = self.or_()
        k, v, pos = self.toks[self.i]
        if k != "end":
            raise _err(self.text, pos, f"unexpected {v!r}")
        return f

    def or_(self):
        parts = [self.and_()]
        while self.peek("name", "or"):
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else (lambda ctx: any(_truth(p(ctx)) for p in parts))

    def and_(self):
        parts = [self.not_()]
        while self.peek("name", "and"):
            self.take()
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else (lambda ctx: all(_truth(p(ctx)) for p in parts))

    def not_(self):
        if self.peek("name", "not"):
            self.take()
            inner = self.not_()
            return lambda ctx: not _truth(inner(ctx))
        return self.compare()

    def compare(self):
        left = self.value()
        k, v, pos = self.toks[self.i]
        op = None
        if k == "op" and v in ("==", "!=", "<", "<=", ">", ">=", "=~"):
            op = v
            self.take()
        elif k == "name" and v == "in":
            op = "in"
            self.take()
        elif k == "name" and v == "not" and self.toks[self.i + 1][:2] == ("name", "in"):
            op = "not in"
            self.i += 2
        if op is None:
            return left
        rpos = self.toks[self.i][2]
        right = self.value()
        if op == "=~":
            pattern = getattr(right, "constant", _MISSING)
            if not isinstance(pattern, str):
                raise _err(self.text, rpos, "=~ takes a regular expression in quotes")
            try:
                search = compile_regex(pattern)
            except ValueError as e:
                raise _err(self.text, rpos, f"bad regular expression: {e}") from None
            return lambda ctx: isinstance(s := left(ctx), str) and search(s)
        test = _OPS[op]
        return lambda ctx: test(left(ctx), right(ctx))

    def value(self):
        k, v, pos = self.take()
        if k == "value":
            return _constant(v)
        if k == "op" and v == "(":
            inner = self.or_()
            self.expect("op", ")")
            return inner
        if k == "op" and v == "[":
            items = []
            if not self.peek("op", "]"):
                items.append(self.value())
                while self.peek("op", ","):
                    self.take()
                    items.append(self.value())
            self.expect("op", "]")
            return lambda ctx: [i(ctx) for i in items]
        if k == "op" and v == ".":
            return self.path(pos)
        if k == "name":
            if v in ("true", "false", "null"):
                return _constant({"true": True, "false": False, "null": None}[v])
            if v in MESSAGE_FIELDS:
                return lambda ctx: ctx.field(v)
            raise _err(self.text, pos, f"unknown name {v!r} (message fields: {', '.join(MESSAGE_FIELDS)}; "
                       f"a body field is a path: .{v})")
        raise _err(self.text, pos, "expected a value, found " + ("the end" if k == "end" else repr(v)))

    def path(self, pos: int):
        steps = []
        if self.peek("name"):
            steps.append(self.take()[1])
        elif not self.peek("op", "["):
            return lambda ctx: ctx.body()  # "." alone: the whole body
        while True:
            if self.peek("op", ".") and self.toks[self.i + 1][0] == "name":
                self.take()
                steps.append(self.take()[1])
            elif self.peek("op", "["):
                self.take()
                k, v, p = self.take()
                if k != "value" or not (isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))):
                    raise _err(self.text, p, "expected an index or a key in quotes inside [ ]")
                self.expect("op", "]")
                steps.append(v)
            else:
                break

        def get(ctx):
            node = ctx.body()
            for s in steps:
                if isinstance(s, str) and isinstance(node, dict):
                    node = node.get(s)
                elif isinstance(s, int) and isinstance(node, list) and -len(node) <= s < len(node):
                    node = node[s]
                else:
                    return None
            return node
        return get


def _constant(v):
    f = lambda ctx: v  # noqa: E731
    f.constant = v
    return f


def _truth(v) -> bool:
    return v is not None and v is not False and v != 0 and v != "" and v != [] and v != {}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _eq(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if _number(a) and _number(b):
        return a == b
    return type(a) is type(b) and a == b


def _order(test):
    def cmp(a, b) -> bool:
        if (_number(a) and _number(b)) or (isinstance(a, str) and isinstance(b, str)):
            return test(a, b)
        return False
    return cmp


def _in(a, b) -> bool:
    if isinstance(b, list):
        return any(_eq(a, x) for x in b)
    if isinstance(b, str) and isinstance(a, str):
        return a in b
    if isinstance(b, dict) and isinstance(a, str):
        return a in b
    return False


_OPS = {"==": _eq, "!=": lambda a, b: not _eq(a, b), "<": _order(lambda a, b: a < b),
        "<=": _order(lambda a, b: a <= b), ">": _order(lambda a, b: a > b), ">=": _order(lambda a, b: a >= b),
        "in": _in, "not in": lambda a, b: not _in(a, b)}


class _Context:
    """One message as a --where expression sees it: the body parsed once, when a path asks."""

    __slots__ = ("m", "_body")

    def __init__(self, m):
        self.m = m
        self._body = _MISSING

    def body(self):
        if self._body is _MISSING:
            try:
                self._body = json.loads(self.m.body)
            except (ValueError, UnicodeDecodeError, RecursionError):
                self._body = None
        return self._body

    def field(self, name: str):
        m = self.m
        if name == "id":
            return m.id.decode("ascii", "replace")
        if name == "size":
            return len(m.body)
        if name == "time":
            return rfc3339(m.timestamp)
        return getattr(m, name)


def compile_where(text: str):
    """A predicate message -> bool for ``--where text``; FilterError when it is not valid."""
    if not text.strip():
        raise FilterError("invalid --where '': empty expression", "--where")
    try:
        expr = _Parser(text).parse()
    except RecursionError:
        raise FilterError(f"invalid --where {text[:40]!r}...: nested too deeply", "--where") from None
    return lambda m: _truth(expr(_Context(m)))


def compile_regex(pattern: str | bytes):
    """RE2's search: a predicate on text (``pattern`` a str) or on bytes (``pattern`` bytes, each
    byte one character). ValueError naming what RE2 refuses."""
    import re2

    options = re2.Options()
    options.log_errors = False  # else RE2 writes its own lines to stderr
    if isinstance(pattern, bytes):
        options.encoding = re2.Options.Encoding.LATIN1
    try:
        rx = re2.compile(pattern, options)
    except re2.error as e:
        why = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        if "perl operator" in why or "escape sequence" in why:
            why += " (RE2 syntax, as Go's regexp: no lookaround, no backreferences)"
        raise ValueError(why) from None
    if isinstance(pattern, bytes):
        return lambda body: rx.search(body) is not None

    def search(text: str) -> bool:
        try:
            return rx.search(text) is not None
        except UnicodeEncodeError:  # a lone surrogate (JSON "\udc80"): not text RE2 can read
            return rx.search(_LONE_SURROGATE.sub("\ufffd", text)) is not None
    return search


def compile_grep(pattern: str):
    """A predicate message -> bool: the regex (on the body's bytes) is found in the body."""
    try:
        search = compile_regex(pattern.encode("utf-8", "surrogateescape"))
    except ValueError as e:
        raise FilterError(f"invalid --grep {pattern!r}: {e}", "--grep") from None
    return lambda m: search(m.body)


class Filter:
    """--grep and --where together (both must match); ``source`` is what to hand to another image."""

    def __init__(self, grep: str | None = None, where: str | None = None):
        self.source = {"grep": grep, "where": where}
        tests = []
        if grep is not None:
            tests.append(compile_grep(grep))
        if where is not None:
            tests.append(compile_where(where))
        self.tests = tests

    def __bool__(self) -> bool:
        return bool(self.tests)

    def __call__(self, m) -> bool:
        return all(t(m) for t in self.tests)


def make_filter(grep: str | None, where: str | None) -> Filter | None:
    """None when neither is given (the hot path stays a plain loop)."""
    if grep is None and where is None:
        return None
    return Filter(grep, where)
