"""``nsqcli version``, ``nsqcli completion SHELL``, ``nsqcli man [COMMAND]``: what a pip install
brings besides the commands themselves."""

from __future__ import annotations

import json
import sys

import click

from ..command import command, option

SHELLS = ("bash", "zsh", "fish")


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """nsqcli, Python, the libraries (pyspark/pyarrow only if the [spark] extra is installed -
    read from package metadata, never imported) and the nsqd the sandbox would run."""
    import platform

    from ...version import __version__

    doc = {"nsqcli": __version__, "python": platform.python_version(),
           "platform": f"{platform.system()} {platform.machine()}"}
    for dist in ("click", "rich", "python-snappy", "pyspark", "pyarrow"):
        doc[dist] = _dist_version(dist)
    doc["nsqd"] = _nsqd_version()
    from ...spark_features import features
    doc["spark_features"] = features(doc["pyspark"])
    return doc


def _nsqd_version() -> str | None:
    import subprocess

    from ...errors import SandboxError
    from ...sandbox import find_binary

    try:
        path = find_binary("nsqd")
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (SandboxError, OSError, subprocess.TimeoutExpired):
        return None
    return f"{out.split()[1] if len(out.split()) > 1 else out} ({path})"


@command(examples="""
nsqcli version
nsqcli version --json | jq -r .pyspark
""")
@option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def version(as_json):
    """Show the versions of nsqcli, Python, its libraries, the optional Spark extra (and what
    that pyspark supports) and nsqd."""
    from ..app import write_stdout

    doc = versions()
    if as_json:
        write_stdout(json.dumps(doc, sort_keys=True) + "\n")
        return 0
    missing = {"pyspark": "not installed (pip install 'nsqcli[spark]')",
               "pyarrow": "not installed (pip install 'nsqcli[spark]')",
               "nsqd": "not found (nsqcli sandbox --install builds it)"}
    spark = doc.pop("spark_features")
    width = max(map(len, doc))
    lines = [f"{k:<{width}}  {v if v is not None else missing.get(k, 'not installed')}\n" for k, v in doc.items()]
    if spark:  # what this pyspark can do, under its line
        at = next(i for i, k in enumerate(doc) if k == "pyspark") + 1
        lines[at:at] = [f"{'':<{width}}    {k}: {v}\n" for k, v in spark.items()]
    write_stdout("".join(lines))
    return 0


@command(examples="""
nsqcli completion bash > ~/.local/share/bash-completion/completions/nsqcli
nsqcli completion zsh > "${fpath[1]}/_nsqcli"
nsqcli completion fish > ~/.config/fish/completions/nsqcli.fish
eval "$(nsqcli completion bash)"        # this shell only
""")
@click.argument("shell", type=click.Choice(SHELLS), metavar="SHELL")
def completion(shell):
    """Print the completion script for SHELL (bash, zsh or fish).

    Install it once with the line for your shell under Examples; it completes commands,
    options and choices.
    """
    from ..app import write_stdout

    from ..docs import completion as completion_script

    write_stdout(completion_script(shell))
    return 0


@command(examples="""
nsqcli man tail
nsqcli man --list
nsqcli man --write ~/.local/share/man/man1    # then: man nsqcli-tail
""")
@click.argument("name", required=False, metavar="[COMMAND]")
@option("--list", "list_", is_flag=True, help="List the pages.")
@option("--write", "write_dir", type=click.Path(file_okay=False), metavar="DIR",
        help="Write every page into DIR (e.g. ~/.local/share/man/man1) instead of showing one.")
def man(name, list_, write_dir):
    """Show the manual page of COMMAND (or of nsqcli itself).

    On a terminal the page is shown with man(1); otherwise the roff source goes to stdout.
    """
    import os
    import shutil
    import subprocess
    import tempfile

    from ..app import write_stdout
    from ..docs import man_pages

    pages = man_pages()
    if list_:
        write_stdout("".join(p[:-2] + "\n" for p in sorted(pages)))
        return 0
    if write_dir:
        os.makedirs(write_dir, exist_ok=True)
        for fname, text in pages.items():
            with open(os.path.join(write_dir, fname), "w", encoding="utf-8") as f:
                f.write(text)
        print(f"nsqcli: wrote {len(pages)} pages into {write_dir}", file=sys.stderr)
        return 0
    fname = "nsqcli.1" if name in (None, "nsqcli") else f"nsqcli-{name}.1"
    if fname not in pages:
        known = ", ".join(sorted(p[7:-2] for p in pages if p != "nsqcli.1"))
        raise click.UsageError(f"no manual page for {name!r} (commands: {known})")
    text = pages[fname]
    if sys.stdout.isatty() and shutil.which("man"):
        with tempfile.NamedTemporaryFile("w", suffix=".1", delete=False) as f:
            f.write(text)
        try:
            return subprocess.call(["man", "-l", f.name])
        finally:
            os.unlink(f.name)
    write_stdout(text)
    return 0
