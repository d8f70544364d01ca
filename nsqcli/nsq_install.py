"""Build the official NSQ programs (nsqd, nsqlookupd, the Go tools, the bench programs) of a
pinned release from the ``github.com/nsqio/nsq`` Go module.

Used by ``scripts/install-nsq`` (into the project's ``.nsq/bin``; other releases, such as the
v1.2.1 the tests also run against, into ``.nsq/versions/VERSION/bin``) and by ``nsqcli sandbox
--install`` (into the user's data directory), so both build the same way. nsq's go.mod has a
``replace`` directive, so ``go install ...@v1.3.0`` is refused: the module is downloaded with
``go mod download`` and built inside its directory.

Releases that build here: v1.3.0, v1.2.1, v1.2.0. Older ones do not: v1.1.0 and v1.0.0-compat
have no go.mod (they pinned their dependencies with dep/godep by git revision), the module
proxy refuses those revisions, and the tagged dependency versions it does serve have other
APIs (go-diskqueue v1.0.0's ReadChan, go-svc's package path) - so they are refused with one
line instead of a page of compiler errors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NSQ_VERSION = "v1.3.0"
APPS = ("nsqd", "nsqlookupd", "nsq_tail", "nsq_to_file", "to_nsq", "nsq_stat", "nsq_to_nsq", "nsq_to_http")
BENCHES = ("bench_reader", "bench_writer")


class InstallError(Exception):
    pass


def user_dir(version: str = NSQ_VERSION) -> Path:
    """Where `nsqcli sandbox --install` puts the programs: $XDG_DATA_HOME/nsqcli/nsq-VERSION."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "nsqcli" / f"nsq-{version}"


def version_dir(root: Path, version: str = NSQ_VERSION) -> Path:
    """Where scripts/install-nsq puts a release in a clone: the pinned one in .nsq/bin (what
    every tool and test finds first), any other in .nsq/versions/VERSION/bin."""
    if version == NSQ_VERSION:
        return root / ".nsq" / "bin"
    return root / ".nsq" / "versions" / version / "bin"


def installed(bin_dir: Path, version: str = NSQ_VERSION) -> bool:
    if not all(os.access(bin_dir / b, os.X_OK) for b in APPS + BENCHES):
        return False
    try:
        out = subprocess.run([str(bin_dir / "nsqd"), "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return False
    return f"nsqd v{version.lstrip('v')}" in out


def install(bin_dir: Path, go_home: Path | None, version: str = NSQ_VERSION, say=print) -> Path:
    """Build into ``bin_dir`` unless already there; returns ``bin_dir``. ``go_home``: a GOPATH,
    module cache and build cache of their own there; None: Go's own (shared with every other Go
    build of this user, so a second clone or a `make clean` builds from cache)."""
    if installed(bin_dir, version):
        say(f"NSQ {version} already in {bin_dir}")
        return bin_dir
    go = shutil.which("go")
    if go is None:
        raise InstallError("'go' not found on PATH. Install Go >= 1.21 (https://go.dev/dl/ or your package "
                           "manager), then run this again - or put nsqd and nsqlookupd on PATH")
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOFLAGS="-mod=mod", GO111MODULE="on", CGO_ENABLED="0")
    if go_home is not None:
        env.update(GOPATH=str(go_home / "path"), GOMODCACHE=str(go_home / "mod"), GOCACHE=str(go_home / "cache"))
    say(f"downloading github.com/nsqio/nsq@{version} through the Go module proxy")
    with tempfile.TemporaryDirectory() as scratch:  # `go mod download -json` wants a module context
        r = subprocess.run([go, "mod", "download", "-json", f"github.com/nsqio/nsq@{version}"], cwd=scratch,
                           env=env, capture_output=True, text=True)
    try:
        info = json.loads(r.stdout or "{}")
    except ValueError:
        info = {}
    src = info.get("Dir", "")
    if r.returncode != 0 or info.get("Error") or not os.path.isdir(src):
        raise InstallError(f"go mod download github.com/nsqio/nsq@{version} failed (is the Go module proxy "
                           f"reachable?): {(info.get('Error') or r.stderr).strip()[:300]}")
    if not os.path.isfile(os.path.join(src, "go.mod")):
        raise InstallError(f"NSQ {version} predates Go modules (no go.mod: its dependencies were pinned by git "
                           f"revision, which the Go module proxy does not serve); v1.2.0 is the oldest release "
                           f"this builds")
    pkgs = [f"./apps/{a}" for a in APPS] + [f"./bench/{b}" for b in BENCHES]
    say(f"building {' '.join(APPS + BENCHES)} in {src}")
    # the module cache is read-only; go build writes only to -o and GOCACHE
    r = subprocess.run([go, "build", "-trimpath", "-o", str(bin_dir) + os.sep, *pkgs], cwd=src, env=env,
                       capture_output=True, text=True)
    if go_home is not None and not (go_home / "mod").is_symlink():  # (a link: someone else's cache)
        subprocess.run(["chmod", "-R", "u+w", str(go_home / "mod")], capture_output=True)  # so rm -rf works
    if r.returncode != 0:
        raise InstallError(f"go build failed: {r.stderr.strip()[-400:]}; if your Go is too old or too new for "
                           f"{version}, retry with GOTOOLCHAIN=go1.21.13")
    if not installed(bin_dir, version):
        raise InstallError(f"built, but '{bin_dir}/nsqd --version' does not report {version}")
    say(f"installed into {bin_dir}")
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    """scripts/install-nsq [VERSION ...]: each release into version_dir() (NSQ_BIN overrides it
    when one version is built); NSQ_VERSION (default for no argument) and NSQ_GO_HOME (Go caches
    of their own there; by default Go's own) from the environment."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a.startswith("-") for a in argv):
        print("usage: scripts/install-nsq [VERSION ...]   (e.g. v1.3.0 v1.2.1; default "
              f"{NSQ_VERSION} into .nsq/bin, others into .nsq/versions/VERSION/bin)", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parent.parent
    versions = argv or [os.environ.get("NSQ_VERSION", NSQ_VERSION)]
    go_home = Path(os.environ["NSQ_GO_HOME"]) if os.environ.get("NSQ_GO_HOME") else None
    for version in versions:
        version = "v" + version.lstrip("v")
        bin_dir = version_dir(root, version)
        if os.environ.get("NSQ_BIN") and len(versions) == 1:
            bin_dir = Path(os.environ["NSQ_BIN"])
        try:
            install(bin_dir, go_home, version, say=lambda m: print(f"install-nsq: {m}", file=sys.stderr, flush=True))
        except InstallError as e:
            print(f"install-nsq: error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
