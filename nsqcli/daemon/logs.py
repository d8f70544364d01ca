"""The daemons' log lines (to-file, to-nsq, to-http, tail under the run harness), click-free.

Two formats, one line per record, each written in ONE write call under one lock (lines from
several threads never glue together):

- text: ``2026-11-27T09:45:08.123Z nsqcli to-file[1234] WARNING: message`` (UTC, ``Z``,
  milliseconds, the pid);
- json: ``{"time": "2026-11-27T09:45:08.123Z", "level": "warning", "pid": 1234, "command":
  "to-file", "event": "source_down", "message": "...", ...fields}``.

A record's event and fields come from ``extra``::

    log.warning("source: %s", err, extra={"event": "source_down", "fields": {"source": address}})

or :func:`extra`; a record without them has ``"event": "log"``. A field whose name is taken by
the envelope (time, level, ...) is kept as ``field_NAME``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

#: --log-level names
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
          "warning": logging.WARNING, "error": logging.ERROR}
ENVELOPE = ("time", "level", "pid", "command", "event", "message")

_lock = threading.RLock()  # re-entrant: a signal handler may log mid-write


def write_stderr(line: str) -> None:
    """One whole line on stderr in one write call under one lock; a closed stderr is ignored."""
    data = line if line.endswith("\n") else line + "\n"
    with _lock:
        try:
            sys.stderr.write(data)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def utc_stamp(t: float) -> str:
    """``2026-11-27T09:45:08.123Z`` (UTC, milliseconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def extra(event: str, **fields) -> dict:
    """``extra=`` for a record with an event name and fields (the JSON format shows them)."""
    return {"event": event, "fields": fields}


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n") if ("\n" in text or "\r" in text) else text


class TextFormatter(logging.Formatter):
    def __init__(self, command: str):
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        text = _one_line(record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            text += f" ({type(e).__name__}: {_one_line(str(e))})"
        return (f"{utc_stamp(record.created)} nsqcli {self.command}[{os.getpid()}] "
                f"{record.levelname}: {text}")


class JsonFormatter(logging.Formatter):
    def __init__(self, command: str):
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": utc_stamp(record.created), "level": record.levelname.lower(), "pid": os.getpid(),
               "command": self.command, "event": getattr(record, "event", None) or "log",
               "message": record.getMessage()}
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            doc["error"] = f"{type(e).__name__}: {e}"
        for k, v in (getattr(record, "fields", None) or {}).items():
            doc[f"field_{k}" if k in doc else k] = v
        return json.dumps(doc, default=str)


class LineHandler(logging.Handler):
    """Each record as one line through ``write`` (default: stderr under this module's lock)."""

    def __init__(self, write: Callable[[str], None] | None = None):
        super().__init__()
        self.write = write or write_stderr

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:
            self.handleError(record)


def level_of(level: str) -> int:
    try:
        return LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r} (debug, info, warn, error)") from None


def setup(command: str, level: str, fmt: str = "text",
          write: Callable[[str], None] | None = None) -> logging.Logger:
    """Configure the "nsqcli" logger (every nsqcli.* logger below it) for ``command``: one
    handler, ``fmt`` "text" or "json", records below ``level`` dropped. Returns the logger
    (give it to App.logger: the app's info/warn/debug lines go through it)."""
    if fmt not in ("text", "json"):
        raise ValueError(f"unknown log format {fmt!r} (text, json)")
    handler = LineHandler(write)
    handler.setFormatter(JsonFormatter(command) if fmt == "json" else TextFormatter(command))
    logger = logging.getLogger("nsqcli")
    logger.handlers[:] = [handler]
    logger.setLevel(level_of(level))
    logger.propagate = False
    return logger
