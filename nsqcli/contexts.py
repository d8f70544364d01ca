"""Named connection settings ("contexts", like `nats context`), stored as TOML files.

Layout (``$NSQCLI_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/nsqcli``, else ``~/.config/nsqcli``)::

    config.toml              context = "prod"        (the selected context)
    contexts/prod.toml       nsqd-tcp-address = ["10.0.0.1:4150"] ...

Keys are the long flag names without ``--``; a context supplies defaults, so flags and
environment variables override it. Secrets are stored only as file references
(``auth-secret-file``), never inline.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .defaults import contexts_dir
from .errors import NSQError

#: key -> kind: "list" of strings, "bool", "int", or "str"
KEYS = {
    "description": "str",
    "nsqd-tcp-address": "list",
    "nsqd-http-address": "list",
    "lookupd-http-address": "list",
    "tls": "bool",
    "tls-ca-file": "str",
    "tls-cert": "str",
    "tls-key": "str",
    "tls-min-version": "str",
    "tls-insecure-skip-verify": "bool",
    "snappy": "bool",
    "deflate": "bool",
    "deflate-level": "int",
    "auth-secret-file": "str",
    "client-id": "str",
    "sandbox-pid": "int",  # saved by `nsqcli sandbox --save-context`: stale once that process is gone
}
#: what a value of each kind looks like, for the error naming a wrong one
_EXAMPLE = {"list": '["127.0.0.1:4150"] (a list of strings)', "bool": "true or false", "int": "a whole number",
            "str": 'a "quoted string"'}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ContextError(NSQError):
    pass


def config_dir() -> Path:
    """Where contexts live; a path that exists but is not a directory is an error (read as "no
    contexts" it would hide every context and make `context add` fail)."""
    path = Path(contexts_dir())  # (pub's fast path looks there too, without pathlib)
    if os.environ.get("NSQCLI_CONFIG_DIR"):
        what = f"NSQCLI_CONFIG_DIR={os.environ['NSQCLI_CONFIG_DIR']}"
    else:
        what = f"the config directory {path}"
    if path.exists() and not path.is_dir():
        raise ContextError(f"{what} is not a directory (nsqcli keeps its contexts in a directory there)")
    return path


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ValueError(f"context name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
    return name


def _path(name: str) -> Path:
    return config_dir() / "contexts" / f"{check_name(name)}.toml"


def names() -> list[str]:
    d = config_dir() / "contexts"
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


def _read_toml(path: Path) -> dict:
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ContextError(f"{path}: not valid TOML: {e}") from None


def load(name: str) -> dict:
    try:
        path = _path(name)
    except ValueError as e:
        raise ContextError(str(e)) from None
    if not path.is_file():
        known = names()
        raise ContextError(f"no context named {name!r} ({'known: ' + ', '.join(known) if known else 'none saved yet'}); "
                           "create one with 'nsqcli context add NAME ...'")
    data = _read_toml(path)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ContextError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    for key, value in data.items():
        data[key] = _checked(path, name, key, value)
    return data


def _checked(path: Path, name: str, key: str, value):
    """``value`` if it is of ``key``'s kind (a lone string where a list is meant becomes a list
    of one); else ContextError naming the file, context and key."""
    kind = KEYS[key]
    if kind == "list" and isinstance(value, str):
        value = [value]
    ok = {"list": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
          "bool": lambda v: isinstance(v, bool),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "str": lambda v: isinstance(v, str)}[kind](value)
    if not ok:
        raise ContextError(f"{path}: context {name!r}: {key} = {_toml_value(value)} is not valid: "
                           f"use {_EXAMPLE[kind]}")
    return value


def _toml_value(value) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def save(name: str, settings: dict) -> Path:
    path = _path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{k} = {_toml_value(settings[k])}" for k in KEYS if settings.get(k) not in (None, (), [], False)]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("# nsqcli context (see 'nsqcli context --help')\n" + "\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def remove(name: str) -> None:
    path = _path(name)
    if not path.is_file():
        raise ContextError(f"no context named {name!r}")
    path.unlink()
    if selected() == name:
        select(None)


def selected() -> str | None:
    path = config_dir() / "config.toml"
    if not path.is_file():
        return None
    return _read_toml(path).get("context") or None


def select(name: str | None) -> None:
    path = config_dir() / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if name is not None:
        load(name)  # exists and is valid
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"context = {_toml_value(name)}\n" if name else "")


def active(explicit: str | None) -> tuple[str | None, dict]:
    """The context to use: the one named (--context / NSQCLI_CONTEXT), else the selected one.
    A selected context that is gone, or a sandbox's context whose sandbox is gone, is an error
    (not a silent fall-back to 127.0.0.1)."""
    name = explicit if explicit is not None else selected()
    if not name or name == "none":
        return None, {}
    if explicit is None and name not in names():
        raise ContextError(f"the selected context {name!r} ({config_dir() / 'config.toml'}) no longer exists; "
                           "select another ('nsqcli context select NAME') or none ('nsqcli context select --none')")
    settings = load(name)
    why = stale(settings)
    if why:
        raise ContextError(f"the sandbox that saved context {name!r} is gone ({why}); start it again or "
                           f"'nsqcli context rm {name}'")
    return name, settings


def stale(settings: dict) -> str | None:
    """Why a context saved by `nsqcli sandbox --save-context` no longer points at anything
    (its sandbox process is gone), or None."""
    pid = settings.get("sandbox-pid")
    if pid is None:
        return None
    return None if _sandbox_running(pid) else f"pid {pid}"


def _sandbox_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # another user's process: assume it is still the sandbox
    try:  # the pid may have been reused (or be a zombie, whose command line is empty)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return True  # no /proc: trust the pid
    return b"nsqcli" in cmdline and b"sandbox" in cmdline


def defaults_for(command, settings: dict) -> dict:
    """click default_map for ``command``: each context key given to the parameter whose long
    flag has that name (``lookupd-http-address`` -> stat's ``lookupd``, tail's ...)."""
    out = {}
    for p in command.params:
        for opt in getattr(p, "opts", ()):
            if opt.startswith("--") and opt[2:] in settings and opt[2:] not in ("description", "sandbox-pid"):
                value = settings[opt[2:]]
                out[p.name] = tuple(value) if KEYS[opt[2:]] == "list" else value
    return out
