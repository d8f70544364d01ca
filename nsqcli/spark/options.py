"""The nsq data source's options: Spark hands them over as a case-insensitive dict of strings.

Connection options mirror the CLI's flags (``--tls-ca-file`` is ``tlsCAFile``...). Every bad value
raises :class:`OptionError` naming the option, at planning time on the driver, before any task.
Pure Python: no pyspark import, so the parsing is testable (and reusable) without a JVM.
"""

from __future__ import annotations

from ..client.config import Config, TLSConfig
from ..errors import NSQError
from ..protocol import validate_channel, validate_topic

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


class OptionError(ValueError):
    """A missing or invalid data source option."""

    def __init__(self, message: str):
        super().__init__(f"nsq data source: {message}")


def _get(options, name: str):
    v = options.get(name)
    if v is None:  # Spark's dict is case-insensitive; a plain dict (tests, helpers) may not be
        lowered = name.lower()
        v = next((val for key, val in options.items() if key.lower() == lowered), None)
    return v


def string(options, name: str, default: str | None = None) -> str | None:
    v = _get(options, name)
    return default if v is None or str(v).strip() == "" else str(v).strip()


def boolean(options, name: str, default: bool = False) -> bool:
    v = _get(options, name)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise OptionError(f"option {name!r} must be true or false, not {v!r}")


def number(options, name: str, default=None, *, minimum: float = 0, integer: bool = True):
    v = _get(options, name)
    if v is None or str(v).strip() == "":
        return default
    try:
        n = int(str(v).strip()) if integer else float(str(v).strip())
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise OptionError(f"option {name!r} must be {kind}, not {v!r}") from None
    if n < minimum:
        raise OptionError(f"option {name!r} must be at least {minimum}, not {v!r}")
    return n


def addresses(options, name: str) -> list[str]:
    """A comma-separated HOST:PORT list (http:// allowed for lookupd addresses)."""
    raw = string(options, name) or ""
    out = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        hostport = part.split("://", 1)[-1].rstrip("/")
        host, sep, port = hostport.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(f"option {name!r}: {part!r} is not HOST:PORT")
        out.append(hostport)
    return list(dict.fromkeys(out))


def topics(options, name: str = "topic", required: bool = True) -> list[str]:
    raw = string(options, name)
    if raw is None:
        if required:
            raise OptionError(f"option {name!r} is required")
        return []
    out = []
    for t in (p.strip() for p in raw.split(",")):
        if t:
            try:
                out.append(validate_topic(t))
            except NSQError as e:
                raise OptionError(f"option {name!r}: {e}") from None
    return list(dict.fromkeys(out))


def channel(options, default: str = "nsqcli_spark") -> str:
    c = string(options, "channel", default)
    try:
        return validate_channel(c)
    except NSQError as e:
        raise OptionError(f"option 'channel': {e}") from None


def endpoints(options) -> tuple[list[str], list[str]]:
    """(nsqd TCP addresses, lookupd HTTP addresses); at least one of them."""
    nsqd = addresses(options, "nsqdTCPAddresses")
    lookupd = addresses(options, "lookupdHTTPAddresses")
    if not nsqd and not lookupd:
        raise OptionError("give option 'nsqdTCPAddresses' or 'lookupdHTTPAddresses' (comma-separated HOST:PORT)")
    return nsqd, lookupd


def config(options, **extra) -> Config:
    """The client Config from the TLS / compression / auth / timeout options."""
    tls_keys = ("tlsCAFile", "tlsCert", "tlsKey", "tlsMinVersion")
    insecure = boolean(options, "tlsInsecureSkipVerify")
    tls_on = boolean(options, "tls") or insecure or any(string(options, k) for k in tls_keys)
    if bool(string(options, "tlsCert")) != bool(string(options, "tlsKey")):
        raise OptionError("options 'tlsCert' and 'tlsKey' go together")
    min_version = string(options, "tlsMinVersion")
    if min_version is not None and min_version not in ("1.0", "1.1", "1.2", "1.3"):
        raise OptionError(f"option 'tlsMinVersion' must be 1.0, 1.1, 1.2 or 1.3, not {min_version!r}")
    snappy, deflate = boolean(options, "snappy"), boolean(options, "deflate")
    if snappy and deflate:
        raise OptionError("options 'snappy' and 'deflate' cannot be used together")
    secret = string(options, "authSecret")
    secret_file = string(options, "authSecretFile")
    if secret_file:  # read where the connection is made (executor or driver), never logged
        try:
            with open(secret_file, encoding="utf-8") as f:
                secret = f.read().strip()
        except OSError as e:
            raise OptionError(f"option 'authSecretFile': cannot read {secret_file}: {e.strerror}") from None
    fields = dict(
        tls=TLSConfig(enabled=tls_on, ca_file=string(options, "tlsCAFile"), cert_file=string(options, "tlsCert"),
                      key_file=string(options, "tlsKey"), min_version=min_version,
                      insecure_skip_verify=insecure),
        snappy=snappy, deflate=deflate, deflate_level=number(options, "deflateLevel", 6, minimum=1),
        auth_secret=secret or None,
        msg_timeout=seconds(options, "msgTimeout"),
    )
    if string(options, "clientId"):
        fields["client_id"] = string(options, "clientId")
    fields.update(extra)
    return Config(**fields)


def seconds(options, name: str) -> float | None:
    """A duration: plain milliseconds ("5000") or with a unit ("5s", "500ms", "2m")."""
    v = string(options, name)
    if v is None:
        return None
    s = v.lower()
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if s.endswith(unit) and s[: -len(unit)].replace(".", "", 1).isdigit():
            return float(s[: -len(unit)]) * scale
    if s.replace(".", "", 1).isdigit():
        return float(s) / 1000.0
    raise OptionError(f"option {name!r} must be a duration like 5s, 500ms or 2m (plain numbers are ms), not {v!r}")

