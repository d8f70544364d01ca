"""The package's layering, checked on the real import graph (relative imports resolved, imports
inside functions included). The rules:

- Each top-level module or package of nsqcli is a layer; ALLOWED below lists, for each layer,
  the other layers it may import. Lower layers never import higher ones: protocol knows nothing
  of the client core, the client core nothing of the CLI, nothing below cli/ imports cli/.
- protocol/ (and client/flow.py, the RDY/backoff policy) is pure: no sockets, threads, clocks,
  logging, subprocesses, os, click or rich (PURE_FORBIDDEN), so it can be tested byte by byte.
- Only cli/ imports click and rich; only spark/ imports pyspark.
- No import cycles between modules (a package and its own modules aside).
- No command module in cli/commands/ imports another: what two commands share lives in cli/
  or a lower layer.

Each rule has a test that shows the checker can fail."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "nsqcli"

#: layer -> the layers of ours it may import (itself always allowed)
ALLOWED = {
    "errors": set(),
    "version": set(),
    "protocol": {"errors"},
    "client": {"protocol", "errors", "version"},
    "records": {"protocol", "errors"},       # record formats: bytes <-> records, templates
    "filters": {"records"},                  # --grep/--where: pure predicates on messages
    "archive": {"client", "protocol", "errors", "records"},
    "relay": {"client", "protocol", "errors", "records", "version"},  # to-nsq copier, to-http delivery
    "loadgen": {"client", "protocol", "errors"},  # bench's publisher/consumer workers
    "spark": {"client", "archive", "relay", "records", "protocol", "errors", "version", "__init__",
              "spark_features"},
    "spark_features": set(),          # what the installed pyspark supports, from its version: stdlib only
    "nsq_install": set(),             # builds NSQ with Go: stdlib only (scripts/install-nsq runs it bare)
    "contexts": {"errors", "defaults"},  # named connection settings (TOML files)
    "sandbox": {"errors", "nsq_install"},
    "daemon": {"client", "protocol", "errors", "version", "clock"},  # run harness's helpers: no click/rich
    "cli": {"client", "archive", "relay", "records", "filters", "loadgen", "protocol", "errors", "sandbox", "spark",
            "spark_features", "contexts", "nsq_install", "version", "stdio", "clock", "daemon", "__init__",
            "exits", "publish", "defaults"},
    "__init__": {"client", "protocol", "version"},
    "stdio": set(),                   # closed standard streams repaired: stdlib only
    "clock": set(),                   # process start, --timeout's origin: stdlib only
    "exits": {"errors"},              # the one exit path (outcome -> line, exit code): no click
    "defaults": set(),                # defaults, NSQCLI_* variables (click and pub's fast path): stdlib only
    "publish": {"client", "errors", "clock", "stdio", "exits"},  # pub's work, for click and the fast path
    # console script: early signals, pub's fast path (its argv scanner; the rest it shares with cli)
    "entry": {"cli", "client", "protocol", "errors", "stdio", "clock", "exits", "publish", "defaults"},
    "__main__": {"entry"},
}
PURE_FORBIDDEN = {"socket", "threading", "time", "logging", "select", "selectors", "ssl",
                  "asyncio", "subprocess", "click", "rich", "os"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Absolute names of every module imported by ``source`` (which is ``module``)."""
    package = module if is_package else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            if not node.module or node.level:  # `from . import x`: x may be a module
                names |= {f"{target}.{a.name}" for a in node.names}
    return names


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "nsqcli":
        return None
    if len(parts) == 1 or not ((PKG / parts[1]).is_dir() or (PKG / f"{parts[1]}.py").exists()):
        return "__init__"  # the root package (or a name in it, such as __version__)
    return parts[1]


def violations(path: Path, source: str | None = None) -> list[str]:
    source = path.read_text() if source is None else source
    mod = module_name(path)
    layer = layer_of(mod)
    out = []
    for name in imports_of(source, mod, path.name == "__init__.py"):
        top = name.split(".")[0]
        if top in ("click", "rich") and layer != "cli":
            out.append(f"{mod} imports {name} (only cli/ may)")
        if top == "pyspark" and layer != "spark":
            out.append(f"{mod} imports {name} (only spark/ may)")
        target = layer_of(name)
        if target is None or target == layer:
            continue
        if target not in ALLOWED.get(layer, set()):
            out.append(f"{mod} imports {name} ({layer} -> {target} is not allowed)")
        if layer in ("protocol",) and top in PURE_FORBIDDEN:
            out.append(f"{mod} imports {name} (protocol is pure)")
    if layer == "protocol" or mod == "nsqcli.client.flow":
        bad = {n.split(".")[0] for n in imports_of(source, mod)} & PURE_FORBIDDEN
        if bad:
            out.append(f"{mod} imports {sorted(bad)} (must stay pure: no I/O, threads, clocks)")
    return out


def test_package_follows_the_layer_rules():
    files = list(PKG.rglob("*.py"))
    assert len(files) > 20
    problems = [v for f in files for v in violations(f)]
    assert not problems, "\n".join(problems)


def test_relative_imports_are_resolved():
    mod = "nsqcli.protocol.frames"
    got = imports_of("from ..errors import X\nfrom .message import M\nfrom .. import client\n", mod)
    assert {"nsqcli.errors", "nsqcli.protocol.message", "nsqcli.client"} <= got


def test_the_checker_can_fail():
    """A relative import from protocol into the client core, a clock in flow, and click in
    the client core are each caught."""
    assert violations(PKG / "protocol" / "frames.py", "from ..client.conn import Connection\n")
    assert violations(PKG / "protocol" / "frames.py", "def f():\n    import time\n")
    assert violations(PKG / "client" / "flow.py", "import time\n")
    assert violations(PKG / "client" / "conn.py", "from ..cli.app import App\n")
    assert violations(PKG / "client" / "conn.py", "def f():\n    import rich\n")
    assert violations(PKG / "archive" / "writer.py", "import pyspark\n")
    assert not violations(PKG / "client" / "conn.py", "from ..protocol import Message\n")


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (names resolved to real modules; a name
    imported from a package is the package unless it is a module of its own)."""
    files = {module_name(f): f for f in PKG.rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        targets = set()
        for name in imports_of(path.read_text(), mod, path.name == "__init__.py"):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != mod:
                targets.add(name)
        graph[mod] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, as the path that closes it (depth-first search)."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_module_imports_itself_through_others():
    """Package roots aside (a package may import its own modules and they its names), no import
    cycles, including imports inside functions: cli/docs <-> cli/meta and client/config <->
    the package root were two."""
    graph = import_graph()
    found = [c for c in cycles(graph)
             if not any(a.startswith(b + ".") or b.startswith(a + ".") for a, b in zip(c, c[1:]))]
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_check_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert not cycles({"a": {"b"}, "b": {"c"}, "c": set()})


COMMANDS = "nsqcli.cli.commands"


def command_imports(path: Path, source: str | None = None) -> list[str]:
    """The other command modules a ``nsqcli.cli.commands.X`` module imports: a command is
    options, wiring and output; what two commands share lives in cli/ or a lower layer."""
    source = path.read_text() if source is None else source
    mod = module_name(path)
    if not mod.startswith(COMMANDS + ".") or path.name == "__init__.py":
        return []
    names = imports_of(source, mod)
    return sorted(f"{mod} imports {n}" for n in names
                  if n.startswith(COMMANDS + ".") and not n.startswith(mod + ".") and n != mod)


def test_no_command_imports_another_command():
    files = list((PKG / "cli" / "commands").glob("*.py"))
    assert len(files) > 10
    problems = [v for f in files for v in command_imports(f)]
    assert not problems, "\n".join(problems)


def test_the_command_check_can_fail():
    """Relative (`from .pub import x`, `from . import pub`), absolute and in-function imports
    of another command are caught; the shared machinery and a lower layer are not."""
    mpub = PKG / "cli" / "commands" / "mpub.py"
    assert command_imports(mpub, "from .pub import resolve_producers\n")
    assert command_imports(mpub, "from . import pub\n")
    assert command_imports(mpub, "def f():\n    from nsqcli.cli.commands.to_file import Size\n")
    assert not command_imports(mpub, "from ..options import resolve_producers\nfrom ...records import envelope\n")
