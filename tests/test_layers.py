"""Import direction rules from DESIGN.md, checked by parsing imports with ast."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "nsqcli"


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_protocol_is_pure():
    forbidden = {"socket", "threading", "time", "logging", "select", "selectors", "ssl",
                 "asyncio", "subprocess", "click", "rich"}
    files = list((PKG / "protocol").glob("*.py"))
    assert files
    for f in files:
        assert not (imports_of(f) & forbidden), f"{f.name} imports {imports_of(f) & forbidden}"


def test_only_cli_imports_click_and_rich():
    for f in PKG.rglob("*.py"):
        if "cli" in f.relative_to(PKG).parts:
            continue
        assert not (imports_of(f) & {"click", "rich"}), f"{f} imports click/rich outside cli/"


def test_flow_is_pure():
    f = PKG / "flow.py"
    if f.exists():
        assert not (imports_of(f) & {"socket", "threading", "time"}), "flow.py must take time as input"
