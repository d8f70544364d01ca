"""The nsq data source's options: Spark hands them over as a case-insensitive dict of strings.

Connection options mirror the CLI's flags (``--tls-ca-file`` is ``tlsCAFile``...). Every bad value
raises :class:`OptionError` naming the option, at planning time on the driver, before any task.
Pure Python: no pyspark import, so the parsing is testable (and reusable) without a JVM.
"""

from __future__ import annotations

import difflib

from ..client.config import Config, TLSConfig
from ..errors import NSQError
from ..protocol import validate_channel, validate_topic

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


class OptionError(ValueError):
    """A missing or invalid data source option (or column, or mode): the user's mistake, told in
    one line. ``detail`` is the message without the "nsq data source: " prefix."""

    def __init__(self, message: str):
        self.detail = message
        super().__init__(f"nsq data source: {message}")

    def __reduce__(self):  # pickles (and so crosses Spark's processes) without a second prefix
        return (type(self), (self.detail,))


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
        scheme, _, rest = part.rpartition("://")
        hostport = rest.rstrip("/")
        host, sep, port = hostport.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(f"option {name!r}: {part!r} is not HOST:PORT")
        if scheme.lower() == "https":
            if not name.endswith("HTTPAddresses"):
                raise OptionError(f"option {name!r}: {part!r}: https is for HTTP addresses")
            hostport = "https://" + hostport  # kept: these are asked over TLS
        elif scheme and scheme.lower() != "http":
            raise OptionError(f"option {name!r}: {part!r}: drop the scheme ({hostport})")
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



# -- which options exist ---------------------------------------------------------------------------
# Spark lowercases option names before a Python data source sees them; these are the spellings
# users write (and the ones the messages show).
CONNECTION = ("nsqdTCPAddresses", "lookupdHTTPAddresses", "tls", "tlsCAFile", "tlsCert", "tlsKey",
              "tlsMinVersion", "tlsInsecureSkipVerify", "snappy", "deflate", "deflateLevel", "authSecret",
              "authSecretFile", "clientId", "msgTimeout", "connectTimeout")
SOURCE = ("topic", "channel", "nsqdHTTPAddresses", "spoolLocation", "maxMessagesPerBatch",
          "maxMessagesPerPartition", "minPartitions", "maxReadTime", "readIdleTimeout", "spoolRetention",
          "plannedBy")
SINK = ("topic", "batchSize", "maxInFlightBatches", "retryTimeout", "retryBackoff", "timeout", "ratePerTask",
        "maxBodySize", "maxMessageSize", "commitReportPath")
# the sink's options that are gone, and what to give instead (keys lowercased)
SINK_GONE = {
    "ratepersecond": ("option 'ratePerSecond' is gone: Spark does not tell a Python writer how many tasks run at "
                      "once, so a whole write's rate cannot be kept; give 'ratePerTask' (messages/s for each task; "
                      "the write's rate is that times the tasks running at once, e.g. the executors' cores)"),
    "numpartitions": ("option 'numPartitions' is gone (it split 'ratePerSecond'): give 'ratePerTask', messages/s "
                      "for each task"),
    "maxretries": ("option 'maxRetries' is gone: give 'retryTimeout' (a duration, default 60s: how long a task "
                   "keeps trying its nsqd addresses, with backoff, after the last OK before it fails)"),
}
# writeStream hands its own options to the sink with the user's: checkpointLocation (the query's
# checkpoint, from .option()) and queryName (from .queryName()). Observed on pyspark 4.3.0; nothing
# else is added (session confs, partitionBy, trigger are not options).
SPARK_SINK = ("checkpointLocation", "queryName")
_WHERE = {"source": "the source (spark.readStream.format('nsq'))",
          "sink": "the sink (df.write / df.writeStream .format('nsq'))"}
_NO_OFFSETS = ("NSQ has no offsets; a channel gets the messages published after it exists; to re-read "
               "history, archive with `nsqcli to-file` and use `nsqcli replay` or nsqcli.spark.read_archive")
_CHANNEL = ("give option 'channel' (consumers on one channel share its messages; every channel gets all "
            "of them)")
_TOPIC = "name the topics with option 'topic' (comma-separated)"
# Kafka's option names -> what NSQ offers instead (keys lowercased)
KAFKA = {
    "subscribe": _TOPIC,
    "subscribepattern": "NSQ cannot subscribe by pattern; " + _TOPIC,
    "assign": "NSQ topics have no partitions to assign; " + _TOPIC,
    **dict.fromkeys(("startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp",
                     "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
                     "startingoffsetsbytimestampstrategy"), _NO_OFFSETS),
    "kafka.bootstrap.servers": ("give option 'nsqdTCPAddresses' (nsqd HOST:PORT, comma-separated) or "
                                "'lookupdHTTPAddresses' (nsqlookupd HOST:PORT)"),
    "kafka.group.id": _CHANNEL,
    "groupidprefix": _CHANNEL,
    "kafka.acks": "NSQ has no such setting; the nsq sink waits for nsqd's OK on every message",
    "maxoffsetspertrigger": "use option 'maxMessagesPerBatch'",
    "failondataloss": ("NSQ has no offsets to lose (nsqd delivers every message again until it is FINed): "
                       "there is nothing to set"),
    "includeheaders": ("NSQ messages have no headers (the source's columns: body, id, timestamp, attempts, "
                       "nsqd, topic, channel)"),
}
_KAFKA_NAMES = {k.lower(): k for k in (
    "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets", "startingTimestamp",
    "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "groupIdPrefix", "maxOffsetsPerTrigger", "failOnDataLoss",
    "includeHeaders")}


def known(kind: str, also: tuple = ()) -> dict[str, str]:
    """lowercased name -> name, for ``kind`` "source" or "sink"."""
    names = CONNECTION + (SOURCE if kind == "source" else SINK + SPARK_SINK) + tuple(also)
    return {n.lower(): n for n in names}


def _kafka_hint(key: str) -> str | None:
    if key in KAFKA:
        return KAFKA[key]
    if key.startswith(("kafka.ssl.", "kafka.security.")):
        return "NSQ has no such setting; for TLS give options 'tls', 'tlsCAFile', 'tlsCert', 'tlsKey'"
    if key.startswith("kafka.sasl."):
        return "NSQ has no such setting; nsqd's authorization takes option 'authSecret' or 'authSecretFile'"
    if key.startswith("kafka."):
        return "NSQ has no such setting (the connection options: " + ", ".join(CONNECTION) + ")"
    return None


def problem(name: str, kind: str, also: tuple = ()) -> str | None:
    """Why option ``name`` is refused by the ``kind`` side, or None when it is one of ours."""
    key = name.lower()
    mine = known(kind, also)
    if key in mine:
        return None
    if kind == "sink" and key in SINK_GONE:
        return SINK_GONE[key]
    shown = _KAFKA_NAMES.get(key, name)
    hint = _kafka_hint(key)
    if hint is not None:
        return f"option {shown!r} is Kafka's: {hint}"
    if key == "path":
        return ("there is no path in NSQ (load(), save() and start() take none): name the topic with option "
                "'topic'")
    if kind == "source" and key in ("checkpointlocation", "queryname"):
        return f"option {name!r} belongs to writeStream (the query), not to readStream.format('nsq')"
    other = known("sink" if kind == "source" else "source")
    if key in other and key not in ("checkpointlocation", "queryname"):
        return f"option {other[key]!r} is for {_WHERE['sink' if kind == 'source' else 'source']}, not {_WHERE[kind]}"
    close = difflib.get_close_matches(key, list(mine), n=1, cutoff=0.75)
    if close:
        return f"unknown option {name!r} (did you mean {mine[close[0]]!r}?)"
    listed = [n for n in mine.values() if n not in SPARK_SINK]
    return f"unknown option {name!r} (the {kind}'s options: {', '.join(listed)})"


def check_options(options, kind: str, also: tuple = ()) -> None:
    """Refuse, in one OptionError naming every problem, any option the ``kind`` side ("source" or
    "sink") does not know: Kafka's with what NSQ offers instead, typos with the closest name."""
    found = [p for p in (problem(k, kind, also) for k in options) if p]
    if found:
        raise OptionError("; ".join(found))


def check_source_schema(fields: list[tuple[str, str]], ddl: str) -> None:
    """``fields``: a user-given schema as (name, Spark simple type) pairs; ``ddl``: the source's fixed
    schema ("body binary, id string, ..."). They must match (names case-insensitively, types, order)."""
    fixed = [tuple(part.split()) for part in ddl.split(",")]
    want = [(n.lower(), t.lower()) for n, t in fixed]
    if [(n.lower(), t.lower()) for n, t in fields] != want:
        raise OptionError("the source's columns are fixed: " + ", ".join(f"{n} {t}" for n, t in fixed)
                          + "; do not give .schema(...) (select or cast the columns after load())")
