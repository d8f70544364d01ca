"""``nsqcli sandbox``: a local NSQ (real nsqlookupd + nsqd on 127.0.0.1) for development."""

from __future__ import annotations

import signal
import sys
import threading

import click

from ..command import command, option
from ..types import DURATION


@command(uses_context=False, examples="""
eval "$(nsqcli sandbox --detach)"             # start in the background; this shell now points at it
nsqcli pub events hello && nsqcli tail events -n 1
kill $NSQCLI_SANDBOX_PID                      # stop it (every process it started)

nsqcli sandbox --nodes 2 --save-context dev   # foreground until Ctrl-C; 'nsqcli --context dev ...'
nsqcli sandbox --install                      # build nsqd/nsqlookupd v1.3.0 with Go, then exit
""")
@option("--nodes", default=1, show_default=True, type=click.IntRange(1, 16),
        help="How many nsqd nodes to start.")
@option("--no-lookupd", is_flag=True, help="Start nsqd only, without nsqlookupd.")
@option("--data-dir", type=click.Path(file_okay=False), default=None,
        help="Keep data and logs here instead of a temporary directory (deleted on exit).")
@option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="nsqd --tls-cert.")
@option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="nsqd --tls-key.")
@option("--auth-http-address", help="nsqd --auth-http-address (host:port of an auth server).")
@option("--msg-timeout", type=DURATION, help="nsqd --msg-timeout, e.g. 60s (a bare number is seconds).")
@option("--max-rdy-count", type=int, help="nsqd --max-rdy-count.")
@option("--no-snappy", is_flag=True, help="Start nsqd with --snappy=false.")
@option("--no-deflate", is_flag=True, help="Start nsqd with --deflate=false.")
@option("--env-file", type=click.Path(dir_okay=False, writable=True),
        help="Also write the export lines to this file once the servers answer.")
@option("--detach", is_flag=True, help="Run in the background: print the export lines (with "
        "NSQCLI_SANDBOX_PID) once the servers answer, then return.")
@option("--save-context", metavar="NAME", help="Save the addresses as context NAME (see 'nsqcli context').")
@option("--install", "install_only", is_flag=True,
        help="Build nsqd, nsqlookupd and the official tools (NSQ v1.3.0) with Go into the user's data "
             "directory, then exit.")
@option("--json", "as_json", is_flag=True, help="Once the servers are up: their addresses, pids and the "
        "environment as one JSON line on stdout (instead of the export lines).")
@click.pass_obj
def sandbox(app, nodes, no_lookupd, data_dir, tls_cert, tls_key, auth_http_address, msg_timeout,
            max_rdy_count, no_snappy, no_deflate, env_file, detach, save_context, install_only, as_json):
    """Run a local NSQ (real nsqlookupd and nsqd on 127.0.0.1, free ports) until Ctrl-C.

    Prints shell export lines on stdout that point every other nsqcli command at it. The NSQ
    programs are looked up in $NSQCLI_NSQ_BIN, a clone's .nsq/bin, the directory that --install
    builds into, then PATH. Ctrl-C or SIGTERM stops every process it started.
    """
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if install_only:
        ctx = click.get_current_context()
        from click.core import ParameterSource

        others = [p.name for p in ctx.command.params if p.name not in ("install_only", "verbose", "quiet")
                  and p.expose_value and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None)]
        if others:
            raise click.UsageError("--install builds NSQ and exits: it takes no other option")
        return _install(app)
    if save_context:
        from ... import contexts

        try:
            contexts.check_name(save_context)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--save-context'") from None
    from ...sandbox import find_binary

    for program in ("nsqd",) + (() if no_lookupd else ("nsqlookupd",)):
        find_binary(program)  # before anything starts: one line saying how to get it
    if detach:
        return _detach(app, as_json, env_file)
    from ...sandbox import NsqdOptions, Sandbox

    opts = NsqdOptions(tls_cert=tls_cert, tls_key=tls_key, auth_http_address=auth_http_address,
                       msg_timeout=None if msg_timeout is None else f"{round(msg_timeout * 1000)}ms",
                       max_rdy_count=max_rdy_count,
                       snappy=not no_snappy, deflate=not no_deflate)
    from ..app import stop_on_signals

    stop = threading.Event()
    stop_on_signals(stop, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    sb = Sandbox(opts, with_lookupd=not no_lookupd, base_dir=data_dir)
    try:
        sb.start()
        for _ in range(nodes - 1):
            sb.add_nsqd()
        _report(app, sb, env_file, as_json)
        if save_context:
            _save(app, sb, save_context)
        while not stop.wait(0.5):
            dead = [s for s in [sb.lookupd, *sb.nsqds] if s is not None and not s.running]
            if dead:
                app.warn(f"{dead[0].kind} at {dead[0].tcp_address} exited: {dead[0].log_tail(3)}")
                return 1
    finally:
        sb.stop()
        app.info("sandbox stopped")
        _remove_detached_log(data_dir)
    return 0


def _remove_detached_log(data_dir) -> None:
    """A detached sandbox's log (in the temporary directory) goes with it, unless --data-dir
    asked to keep things; a sandbox that failed to start keeps it (its path was said)."""
    import os

    path = os.environ.get("NSQCLI_SANDBOX_LOG")
    if path and data_dir is None and path.endswith(".log") and os.path.basename(path).startswith("nsqcli-sandbox-"):
        try:
            os.unlink(path)
        except OSError:
            pass


def _report(app, sb, env_file, as_json: bool = False) -> None:
    import os
    import shlex

    lines = [f"export {k}={shlex.quote(v)}" for k, v in sb.env().items()]
    if as_json:
        _json_line({"env": sb.env(), "data_dir": str(sb.base_dir),
                    "nsqd": [{"pid": s.pid, "tcp_address": s.tcp_address, "http_address": s.http_address,
                              "https_address": s.https_address} for s in sb.nsqds],
                    "nsqlookupd": {"pid": sb.lookupd.pid, "tcp_address": sb.lookupd.tcp_address,
                                   "http_address": sb.lookupd.http_address} if sb.lookupd else None})
    else:
        print("\n".join(lines), flush=True)
    if env_file:  # written whole, then renamed: a reader never sees half of it
        tmp = f"{env_file}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, env_file)
    for server in sb.nsqds:
        app.info(f"nsqd pid {server.pid}: tcp {server.tcp_address}, http {server.http_address}"
                 + (f", https {server.https_address}" if server.https_address else ""))
    if sb.lookupd:
        app.info(f"nsqlookupd pid {sb.lookupd.pid}: tcp {sb.lookupd.tcp_address}, "
                 f"http {sb.lookupd.http_address}")
    app.info(f"data and logs in {sb.base_dir}; Ctrl-C to stop")
    sys.stderr.flush()


def _install(app) -> int:
    from ...errors import NSQError
    from ...nsq_install import InstallError, install, user_dir

    target = user_dir()
    cache = target.parent / "go"
    try:
        install(target / "bin", cache, say=app.info)
    except InstallError as e:
        raise NSQError(str(e)) from None
    app.info(f"nsqcli sandbox now finds nsqd in {target / 'bin'} (Go's cache: {cache}, removable)")
    return 0


def _save(app, sb, name: str) -> None:
    from ... import contexts

    import os

    settings = {"description": f"nsqcli sandbox (data in {sb.base_dir})", "sandbox-pid": os.getpid(),
                "nsqd-tcp-address": [s.tcp_address for s in sb.nsqds],
                "nsqd-http-address": [s.http_address for s in sb.nsqds]}
    if sb.lookupd:
        settings["lookupd-http-address"] = [sb.lookupd.http_address]
    path = contexts.save(name, settings)
    app.info(f"saved as context {name!r} ({path}); use it with --context {name}")


def _json_line(doc: dict) -> None:
    import json

    from ..app import write_stdout

    write_stdout(json.dumps(doc) + "\n")


def _detach(app, as_json: bool = False, env_file: str | None = None) -> int:
    """Start this same command in a new session with --env-file, wait until it wrote the file
    (servers up) or died, print the lines plus NSQCLI_SANDBOX_PID and return: the caller's
    $(...) ends because the child's stdout is a log file, not the caller's pipe."""
    import os
    import subprocess
    import tempfile
    import time

    from ...errors import NSQError

    argv, rest = [], iter(sys.argv[1:])
    for a in rest:  # the child writes its own --env-file; the user's is written here
        if a in ("--detach", "--json") or a.startswith("--env-file="):
            continue
        if a == "--env-file":
            next(rest, None)
            continue
        argv.append(a)
    fd, env_path = tempfile.mkstemp(prefix="nsqcli-sandbox-", suffix=".env")
    os.close(fd)
    os.unlink(env_path)
    log_path = env_path[:-4] + ".log"
    with open(log_path, "wb") as log:
        child = subprocess.Popen([sys.executable, "-m", "nsqcli", *argv, "--env-file", env_path],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                 env={**os.environ, "NSQCLI_SANDBOX_LOG": log_path})
    deadline = time.monotonic() + 60
    while not os.path.exists(env_path):
        if child.poll() is not None or time.monotonic() > deadline:
            if child.poll() is None:
                child.kill()
            with open(log_path, errors="replace") as f:
                tail = [ln.strip() for ln in f if ln.strip()][-3:]
            raise NSQError(f"the sandbox did not start: {' / '.join(tail) or 'no output'} (log: {log_path})")
        time.sleep(0.05)
    time.sleep(0.05)  # the file is written in one go; let the writer close it
    with open(env_path) as f:
        lines = f.read()
    os.unlink(env_path)
    if env_file:  # `nsqcli sandbox --detach --env-file F && . F`: F exists only once the servers answer
        with open(env_file + ".tmp", "w") as f:
            f.write(lines + f"export NSQCLI_SANDBOX_PID={child.pid}\n")
        os.replace(env_file + ".tmp", env_file)
    if as_json:
        import shlex

        env = dict(w.split("=", 1) for ln in lines.splitlines() if ln.startswith("export ")
                   for w in shlex.split(ln[len("export "):]))
        _json_line({"env": {**env, "NSQCLI_SANDBOX_PID": str(child.pid)}, "pid": child.pid, "log": log_path})
    else:
        print(lines + f"export NSQCLI_SANDBOX_PID={child.pid}", flush=True)
    app.info(f"sandbox running in the background, pid {child.pid}, log {log_path}; stop it with "
             "kill $NSQCLI_SANDBOX_PID")
    return 0
