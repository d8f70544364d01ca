"""Connection options shared by every command that talks TCP to nsqd, each with an NSQCLI_*
environment variable, and the one function that turns them into a Config."""

from __future__ import annotations

import click

from .command import option
from .types import DURATION, HOST_PORT, HTTP_ADDRESS

DEFAULT_NSQD = "127.0.0.1:4150"


def _opt(*decls, group: str = "Connection", **kw):
    kw.setdefault("show_envvar", True)
    return option(*decls, group=group, **kw)


def connection_options(consumer: bool = False):
    """Decorator adding --nsqd-tcp-address, --lookupd-http-address, TLS, compression, auth..."""
    opts = [
        _opt("--nsqd-tcp-address", "nsqd_tcp_addresses", multiple=True, type=HOST_PORT,
             envvar="NSQCLI_NSQD_TCP_ADDRESS",
             help=f"nsqd TCP address (repeatable; env: space-separated). Default {DEFAULT_NSQD} "
                  "when no lookupd is given either."),
        _opt("--lookupd-http-address", "lookupd_http_addresses", multiple=True, type=HTTP_ADDRESS,
             envvar="NSQCLI_LOOKUPD_HTTP_ADDRESS",
             help="nsqlookupd HTTP address, HOST:PORT or URL (repeatable)."),
        _opt("--tls", group="TLS", is_flag=True, envvar="NSQCLI_TLS", help="Negotiate TLS (certificates verified)."),
        _opt("--tls-ca-file", group="TLS", type=click.Path(exists=True, dir_okay=False), envvar="NSQCLI_TLS_CA_FILE",
             help="CA bundle to verify nsqd's certificate."),
        _opt("--tls-cert", group="TLS", type=click.Path(exists=True, dir_okay=False), envvar="NSQCLI_TLS_CERT",
             help="Client certificate (PEM)."),
        _opt("--tls-key", group="TLS", type=click.Path(exists=True, dir_okay=False), envvar="NSQCLI_TLS_KEY",
             help="Client key (PEM)."),
        _opt("--tls-min-version", group="TLS", type=click.Choice(["1.0", "1.1", "1.2", "1.3"]),
             envvar="NSQCLI_TLS_MIN_VERSION", help="Minimum TLS version."),
        _opt("--tls-insecure-skip-verify", group="TLS", is_flag=True, envvar="NSQCLI_TLS_INSECURE_SKIP_VERIFY",
             help="Do not verify nsqd's certificate or hostname (insecure)."),
        _opt("--snappy", group="Compression", is_flag=True, envvar="NSQCLI_SNAPPY", help="Negotiate snappy compression."),
        _opt("--deflate", group="Compression", is_flag=True, envvar="NSQCLI_DEFLATE", help="Negotiate deflate compression."),
        _opt("--deflate-level", group="Compression", type=click.IntRange(1, 9), default=6, envvar="NSQCLI_DEFLATE_LEVEL",
             help="Deflate level (nsqd caps it at its --max-deflate-level)."),
        _opt("--auth-secret", group="Auth", envvar="NSQCLI_AUTH_SECRET",
             help="Secret for nsqd AUTH (never logged). On the command line it is visible to every user "
                  "in 'ps': prefer --auth-secret-file or NSQCLI_AUTH_SECRET."),
        _opt("--auth-secret-file", group="Auth", type=click.Path(exists=True, dir_okay=False),
             envvar="NSQCLI_AUTH_SECRET_FILE", help="Read the AUTH secret from this file."),
        _opt("--client-id", envvar="NSQCLI_CLIENT_ID", help="client_id sent in IDENTIFY (default: short hostname)."),
        _opt("--heartbeat-interval", type=DURATION, default="30s", envvar="NSQCLI_HEARTBEAT_INTERVAL",
             help="Heartbeat interval asked of nsqd."),
        _opt("--msg-timeout", type=DURATION, envvar="NSQCLI_MSG_TIMEOUT",
             help="Server-side message timeout for this client (default: nsqd's)."),
    ]
    if consumer:
        opts.append(_opt("--lookupd-poll-interval", type=DURATION, default="60s", envvar="NSQCLI_LOOKUPD_POLL_INTERVAL",
                         help="How often to ask nsqlookupd for new nsqd (a lost nsqd is looked for sooner)."))
        opts.append(_opt("--sample-rate", type=click.IntRange(0, 99), default=0, envvar="NSQCLI_SAMPLE_RATE",
                         help="Deliver only this percentage of messages (0 = all)."))

    def decorate(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return decorate


def destination_options(f):
    """--destination-*: where `to-nsq` publishes, with its own TLS, compression and AUTH."""
    opts = [
        _opt("--destination-nsqd-tcp-address", "dest_nsqd_tcp_addresses", multiple=True, type=HOST_PORT,
             group="Destination", show_envvar=False, help="nsqd to publish to (repeatable)."),
        _opt("--destination-lookupd-http-address", "dest_lookupd_http_addresses", multiple=True,
             type=HTTP_ADDRESS, group="Destination", show_envvar=False,
             help="Publish to the nsqd this nsqlookupd knows (those carrying the topic, else all)."),
        _opt("--destination-tls", "dest_tls", is_flag=True, group="Destination", show_envvar=False),
        _opt("--destination-tls-ca-file", "dest_tls_ca_file", type=click.Path(exists=True, dir_okay=False),
             group="Destination", show_envvar=False),
        _opt("--destination-tls-cert", "dest_tls_cert", type=click.Path(exists=True, dir_okay=False),
             group="Destination", show_envvar=False),
        _opt("--destination-tls-key", "dest_tls_key", type=click.Path(exists=True, dir_okay=False),
             group="Destination", show_envvar=False),
        _opt("--destination-tls-insecure-skip-verify", "dest_tls_insecure_skip_verify", is_flag=True,
             group="Destination", show_envvar=False),
        _opt("--destination-snappy", "dest_snappy", is_flag=True, group="Destination", show_envvar=False),
        _opt("--destination-deflate", "dest_deflate", is_flag=True, group="Destination", show_envvar=False),
        _opt("--destination-auth-secret", "dest_auth_secret", group="Destination", show_envvar=False,
             envvar="NSQCLI_DESTINATION_AUTH_SECRET", help="AUTH secret for the destination (env: "
             "NSQCLI_DESTINATION_AUTH_SECRET). On the command line it is visible to every user in 'ps': "
             "prefer --destination-auth-secret-file or the variable."),
        _opt("--destination-auth-secret-file", "dest_auth_secret_file", type=click.Path(exists=True, dir_okay=False),
             group="Destination", show_envvar=False),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def pop_destination(kwargs: dict) -> dict:
    """The --destination-* options as connection options (same keys as pop_connection)."""
    dest = {k[len("dest_"):]: kwargs.pop(k) for k in list(kwargs) if k.startswith("dest_")}
    dest["option_prefix"] = "destination-"  # for messages about its options
    return dest


CONNECTION_KEYS = ("nsqd_tcp_addresses", "lookupd_http_addresses", "tls", "tls_ca_file", "tls_cert",
                   "tls_key", "tls_min_version", "tls_insecure_skip_verify", "snappy", "deflate",
                   "deflate_level", "auth_secret", "auth_secret_file", "client_id", "heartbeat_interval",
                   "msg_timeout", "sample_rate", "lookupd_poll_interval")


def pop_connection(kwargs: dict) -> dict:
    """Remove the connection options from a command's kwargs."""
    return {k: kwargs.pop(k) for k in CONNECTION_KEYS if k in kwargs}


def build_config(conn: dict, **extra):
    """Config from the parsed connection options (validated; errors are usage errors)."""
    from ..client.config import Config, TLSConfig

    if conn.get("snappy") and conn.get("deflate"):
        raise click.UsageError("--snappy and --deflate cannot be used together")
    if bool(conn.get("tls_cert")) != bool(conn.get("tls_key")):
        raise click.UsageError("--tls-cert and --tls-key go together")
    security_hints(conn)
    secret = conn.get("auth_secret")
    if conn.get("auth_secret_file"):
        with open(conn["auth_secret_file"], encoding="utf-8") as f:
            secret = f.read().strip()
    tls_wanted = conn.get("tls") or any(conn.get(k) for k in ("tls_ca_file", "tls_cert",
                                                              "tls_insecure_skip_verify", "tls_min_version"))
    tls = TLSConfig(enabled=bool(tls_wanted), ca_file=conn.get("tls_ca_file"), cert_file=conn.get("tls_cert"),
                    key_file=conn.get("tls_key"), min_version=conn.get("tls_min_version"),
                    insecure_skip_verify=bool(conn.get("tls_insecure_skip_verify")))
    fields = dict(tls=tls, snappy=bool(conn.get("snappy")), deflate=bool(conn.get("deflate")),
                  deflate_level=conn.get("deflate_level") or 6, auth_secret=secret or None,
                  heartbeat_interval=conn.get("heartbeat_interval") or 30.0,
                  msg_timeout=conn.get("msg_timeout"), sample_rate=conn.get("sample_rate") or 0)
    if conn.get("client_id"):
        fields["client_id"] = conn["client_id"]
    if secret:
        fields["on_notice"] = _once_to_stderr()
    if conn.get("lookupd_poll_interval"):
        fields["lookupd_poll_interval"] = max(0.1, conn["lookupd_poll_interval"])
    fields.update(extra)
    return Config(**fields)


def security_hints(conn: dict) -> None:
    """Warnings about options that weaken security, each said once per run however many
    connections (and configs) the command makes: certificates not verified, an AUTH secret
    file others can read (as ssh says of keys), a secret on the command line (``ps`` shows it)."""
    import os

    prefix = conn.get("option_prefix", "")
    if conn.get("tls_insecure_skip_verify"):
        _hint_once(f"--{prefix}tls-insecure-skip-verify: nsqd's certificate and hostname are not checked; "
                   "anyone on the path can read and change the traffic")
    path = conn.get("auth_secret_file")
    if path:
        try:
            mode = os.stat(path).st_mode & 0o777
        except OSError:
            mode = 0
        if mode & 0o077:
            _hint_once(f"--{prefix}auth-secret-file {path} has mode {mode:04o}: other users may read the "
                       f"secret; chmod 600 {path}")
    ctx = click.get_current_context(silent=True)
    name = ("dest_" if prefix else "") + "auth_secret"
    if conn.get("auth_secret") and ctx is not None and name in ctx.params:
        from click.core import ParameterSource

        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            env = "NSQCLI_" + (prefix.upper().replace("-", "_")) + "AUTH_SECRET"
            _hint_once(f"--{prefix}auth-secret on the command line is visible to every user in 'ps': use "
                       f"--{prefix}auth-secret-file or {env}")


def _hint_once(text: str) -> None:
    """One warning line, once per run (the run's click context holds what was said)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    said = ctx.find_root().meta.setdefault("nsqcli.hints", set())
    if text in said:
        return
    said.add(text)
    app = ctx.obj
    if app is not None and hasattr(app, "warn"):
        app.warn(text)


def _once_to_stderr():
    """A warning on stderr, once per sentence, silenced by -q (the command's App)."""
    import threading

    ctx = click.get_current_context(silent=True)
    app = ctx.obj if ctx is not None else None
    said: set[str] = set()
    lock = threading.Lock()

    def notice(text: str) -> None:
        with lock:
            if text in said:
                return
            said.add(text)
        if app is not None:
            app.warn(text)

    return notice


def nsqd_addresses(conn: dict) -> list[str]:
    """Explicit nsqd addresses, or the default when neither nsqd nor lookupd was given."""
    addrs = list(conn.get("nsqd_tcp_addresses") or ())
    if not addrs and not conn.get("lookupd_http_addresses"):
        addrs = [DEFAULT_NSQD]
    return addrs
