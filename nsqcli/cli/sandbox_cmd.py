"""``nsqcli sandbox``: a local NSQ (real nsqlookupd + nsqd on 127.0.0.1) for development."""

from __future__ import annotations

import signal
import sys
import threading

import click


@click.command()
@click.option("--nodes", default=1, show_default=True, type=click.IntRange(1, 16),
              help="How many nsqd nodes to start.")
@click.option("--no-lookupd", is_flag=True, help="Start nsqd only, without nsqlookupd.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Keep data and logs here instead of a temporary directory (deleted on exit).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="nsqd --tls-cert.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="nsqd --tls-key.")
@click.option("--auth-http-address", help="nsqd --auth-http-address (host:port of an auth server).")
@click.option("--msg-timeout", help="nsqd --msg-timeout, e.g. 60s.")
@click.option("--max-rdy-count", type=int, help="nsqd --max-rdy-count.")
@click.option("--no-snappy", is_flag=True, help="Start nsqd with --snappy=false.")
@click.option("--no-deflate", is_flag=True, help="Start nsqd with --deflate=false.")
@click.option("--env-file", type=click.Path(dir_okay=False, writable=True),
              help="Also write the export lines to this file once the servers answer.")
@click.pass_obj
def sandbox(app, nodes, no_lookupd, data_dir, tls_cert, tls_key, auth_http_address, msg_timeout,
            max_rdy_count, no_snappy, no_deflate, env_file):
    """Run a local NSQ in the foreground until Ctrl-C.

    Starts real nsqlookupd and nsqd processes (built by scripts/install-nsq) on 127.0.0.1 with
    free ports and prints shell export lines on stdout, so that

    \b
        eval "$(nsqcli sandbox --env-file /tmp/nsq.env &)"; . /tmp/nsq.env

    points every other nsqcli command at it. Ctrl-C or SIGTERM stops every process it started.
    """
    from ..sandbox import NsqdOptions, Sandbox

    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    opts = NsqdOptions(tls_cert=tls_cert, tls_key=tls_key, auth_http_address=auth_http_address,
                       msg_timeout=msg_timeout, max_rdy_count=max_rdy_count,
                       snappy=not no_snappy, deflate=not no_deflate)
    from .app import stop_on_signals

    stop = threading.Event()
    stop_on_signals(stop, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    sb = Sandbox(opts, with_lookupd=not no_lookupd, base_dir=data_dir)
    try:
        sb.start()
        for _ in range(nodes - 1):
            sb.add_nsqd()
        _report(app, sb, env_file)
        while not stop.wait(0.5):
            dead = [s for s in [sb.lookupd, *sb.nsqds] if s is not None and not s.running]
            if dead:
                app.warn(f"{dead[0].kind} at {dead[0].tcp_address} exited: {dead[0].log_tail(3)}")
                return 1
    finally:
        sb.stop()
        app.info("sandbox stopped")
    return 0


def _report(app, sb, env_file) -> None:
    lines = [f"export {k}={v}" for k, v in sb.env().items()]
    print("\n".join(lines), flush=True)
    if env_file:
        with open(env_file, "w") as f:
            f.write("\n".join(lines) + "\n")
    for server in sb.nsqds:
        app.info(f"nsqd pid {server.pid}: tcp {server.tcp_address}, http {server.http_address}"
                 + (f", https {server.https_address}" if server.https_address else ""))
    if sb.lookupd:
        app.info(f"nsqlookupd pid {sb.lookupd.pid}: tcp {sb.lookupd.tcp_address}, "
                 f"http {sb.lookupd.http_address}")
    app.info(f"data and logs in {sb.base_dir}; Ctrl-C to stop")
    sys.stderr.flush()
