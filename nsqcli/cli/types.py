"""click parameter types: durations, sizes, host:port addresses, topic names, delimiters."""

from __future__ import annotations

import re

import click



class Duration(click.ParamType):
    """'250ms', '2s', '1.5m', '1h30m' (Go's form), or a bare number of seconds -> float seconds."""

    name = "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        from ..clock import parse_duration

        try:
            return parse_duration(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.I)


class Rate(click.FloatRange):
    """A positive, finite number per second (``nan`` and ``inf`` parse as floats: refused)."""

    def __init__(self):
        super().__init__(min=0, min_open=True)

    def convert(self, value, param, ctx):
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number (e.g. 500 or 0.5)", param, ctx)
        return number


RATE = Rate()


class Size(click.ParamType):
    """Bytes: 1048576, 512K, 100M, 2G."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        m = _SIZE.match(str(value))
        if not m:
            self.fail(f"{value!r} is not a size (use e.g. 100M, 512K, 1048576)", param, ctx)
        return int(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower())


class Moment(click.ParamType):
    """A point in time: ISO 8601 ('2026-11-22T08:00:00Z', '2026-11-22 08:00', a date; UTC
    unless an offset is given) or a duration ago ('2h', '30m')."""

    name = "TIME"

    def convert(self, value, param, ctx):
        import datetime as dt

        if isinstance(value, dt.datetime):
            return value
        from ..clock import parse_duration

        text = str(value).strip()
        if text and not text.replace(".", "").isdigit():  # a bare number is not "that long ago"
            try:
                return dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=parse_duration(text))
            except ValueError:
                pass
        try:
            t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            self.fail(f"{value!r} is not a time (use ISO 8601 like 2026-11-22T08:00:00Z, or 2h for two hours ago)",
                      param, ctx)
        return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def _address_footgun(value: str, param, ctx, http: bool) -> str | None:
    """What is wrong with an address that would otherwise pass (or fail obscurely): a scheme
    where HOST:PORT is meant (``tcp://h:4150``), a comma list (``a:4161,b:4161``, which a TCP
    address read as host ``a:4161,b``). None when nothing is."""
    text = str(value)
    scheme, sep, rest = text.partition("://")
    if sep and not (http and scheme.lower() in ("http", "https")):
        bare = rest.split("/", 1)[0]
        return f"invalid {'HTTP ' if http else ''}address {text!r}: drop the scheme: {bare}"
    if sep and rest.split("/", 1)[1:] not in ([], [""]):
        return (f"invalid HTTP address {text!r}: a path is not used (nsqcli asks /lookup, /stats ... "
                f"itself); give {scheme}://{rest.split('/', 1)[0]}")
    if "," in text:
        return _comma_list(text, param, ctx)
    return None


def _comma_list(text: str, param, ctx) -> str:
    from click.core import ParameterSource

    import os

    parts = [p.strip() for p in text.split(",") if p.strip()]
    envvar = param.envvar if param is not None and isinstance(param.envvar, str) else None
    if envvar and ctx is not None and ctx.get_parameter_source(param.name) == ParameterSource.ENVIRONMENT:
        text = os.environ.get(envvar, text)  # the whole variable (click split it at spaces)
        parts = [p for p in re.split(r"[\s,]+", text) if p]
        return (f"{envvar} has a comma list {text!r}: separate several addresses with spaces "
                f"({envvar}='{' '.join(parts)}')")
    flag = max(param.opts, key=len) if param is not None else "the flag"
    return f"{text!r} is a comma list: give one address per {flag} ({' '.join(f'{flag} {p}' for p in parts)})"


class HostPort(click.ParamType):
    """HOST:PORT of a TCP address (nsqd), checked like nsqd's: ``parse`` raises ValueError."""

    name = "HOST:PORT"

    @staticmethod
    def parse(value: str) -> None:
        from ..client.transport import split_address

        split_address(value)

    def convert(self, value, param, ctx):
        problem = _address_footgun(value, param, ctx, http=False)
        if problem:
            self.fail(problem, param, ctx)
        try:
            self.parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value


class ListenAddress(HostPort):
    """HOST:PORT to listen on (--metrics-address): also ``[V6]:PORT``, ``:PORT`` (every
    interface) and port 0 (any free port; the command says which it got)."""

    @staticmethod
    def parse(value: str) -> None:
        from ..daemon.metrics import parse_address

        parse_address(value)


class HttpAddress(click.ParamType):
    """HOST:PORT or http(s)://HOST:PORT of an HTTP endpoint (nsqd, nsqlookupd)."""

    name = "HOST:PORT"

    def convert(self, value, param, ctx):
        from ..client.http import base_url
        from ..client.transport import split_address

        problem = _address_footgun(value, param, ctx, http=True)
        if problem:
            self.fail(problem, param, ctx)
        try:
            if "://" not in str(value):
                split_address(value)  # HOST:PORT, checked like nsqd's TCP addresses
            base_url(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value


class TopicName(click.ParamType):
    name = "TOPIC"

    def __init__(self, kind: str = "topic"):
        self.kind = kind
        self.name = kind.upper()

    def convert(self, value, param, ctx):
        from ..errors import LocalProtocolError
        from ..protocol.names import validate_channel, validate_topic

        try:
            return (validate_topic if self.kind == "topic" else validate_channel)(value)
        except LocalProtocolError as e:
            self.fail(str(e), param, ctx)


class Delimiter(click.ParamType):
    """One byte: a character or an escape (\\n, \\0, \\t, \\r, \\xNN)."""

    name = "BYTE"

    def convert(self, value, param, ctx):
        if isinstance(value, bytes):
            return value
        try:
            data = value.encode("latin-1").decode("unicode_escape").encode("latin-1")
        except (UnicodeError, ValueError):
            data = b""
        if len(data) != 1:
            self.fail(f"delimiter must be exactly one byte (e.g. ',', '\\n', '\\0', '\\x1e'), got {value!r}",
                      param, ctx)
        return data


DURATION = Duration()
MOMENT = Moment()
HOST_PORT = HostPort()
LISTEN_ADDRESS = ListenAddress()
HTTP_ADDRESS = HttpAddress()
TOPIC = TopicName("topic")
CHANNEL = TopicName("channel")
DELIMITER = Delimiter()
