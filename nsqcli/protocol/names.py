"""Topic and channel name rules (nsq internal/protocol/names.go)."""

from __future__ import annotations

import re

from ..errors import LocalProtocolError

_NAME = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")  # fullmatch: Go's $ never matches before "\n"
MAX_NAME_LENGTH = 64


def _validate(kind: str, name: str) -> str:
    if not isinstance(name, str):
        raise LocalProtocolError(f"{kind} name must be a string, got {type(name).__name__}")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise LocalProtocolError(
            f"invalid {kind} name {name!r}: must be 1-{MAX_NAME_LENGTH} characters, got {len(name)}")
    if not _NAME.fullmatch(name):
        raise LocalProtocolError(
            f"invalid {kind} name {name!r}: only letters, digits, '.', '_', '-' "
            "and an optional '#ephemeral' suffix are allowed")
    return name


def validate_topic(name: str) -> str:
    """Return ``name`` if it is a legal topic name, else raise LocalProtocolError."""
    return _validate("topic", name)


def validate_channel(name: str) -> str:
    """Return ``name`` if it is a legal channel name, else raise LocalProtocolError."""
    return _validate("channel", name)

