"""Connection options shared by every command that talks TCP to nsqd, each with an NSQCLI_*
environment variable, and the one function that turns them into a Config."""

from __future__ import annotations

import click

from .command import option
from ..defaults import NSQD_TCP_ADDRESS as DEFAULT_NSQD
from .types import CHANNEL, DURATION, HOST_PORT, HTTP_ADDRESS, LISTEN_ADDRESS, TOPIC


def _opt(*decls, group: str = "Connection", **kw):
    kw.setdefault("show_envvar", True)
    return option(*decls, group=group, **kw)


def connection_options(consumer: bool = False, lookupd_poll: bool | None = None):
    """Decorator adding --nsqd-tcp-address, --lookupd-http-address, TLS, compression, auth...;
    a ``consumer`` also gets --lookupd-poll-interval and --sample-rate (``lookupd_poll``: the
    first without the second, as to-file takes it)."""
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
    if consumer if lookupd_poll is None else lookupd_poll:
        opts.append(_opt("--lookupd-poll-interval", type=DURATION, default="60s", envvar="NSQCLI_LOOKUPD_POLL_INTERVAL",
                         help="How often to ask nsqlookupd for new nsqd (a lost nsqd is looked for sooner)."))
    if consumer:
        opts.append(_opt("--sample-rate", type=click.IntRange(0, 99), default=0, envvar="NSQCLI_SAMPLE_RATE",
                         help="Deliver only this percentage of messages (0 = all)."))

    def decorate(f):
        for o in reversed(opts):
            f = o(f)
        return f

    return decorate


def http_tls_options(f):
    """--tls-ca-file, --tls-cert, --tls-key, --tls-insecure-skip-verify for commands that speak
    only HTTP (stat, lookup, topic/channel/node): how https:// nsqd and nsqlookupd HTTP
    addresses are verified. See setup_http_tls."""
    opts = [
        _opt("--tls-ca-file", group="TLS", type=click.Path(exists=True, dir_okay=False), envvar="NSQCLI_TLS_CA_FILE",
             help="CA bundle to verify https:// nsqd/nsqlookupd addresses (default: the system's CAs)."),
        _opt("--tls-cert", group="TLS", type=click.Path(exists=True, dir_okay=False), envvar="NSQCLI_TLS_CERT",
             help="Client certificate (PEM) for https:// addresses that require one."),
        _opt("--tls-key", group="TLS", type=click.Path(exists=True, dir_okay=False), envvar="NSQCLI_TLS_KEY",
             help="Client key (PEM)."),
        _opt("--tls-insecure-skip-verify", group="TLS", is_flag=True, envvar="NSQCLI_TLS_INSECURE_SKIP_VERIFY",
             help="Do not verify https:// certificates or hostnames (insecure)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


HTTP_TLS_KEYS = ("tls_ca_file", "tls_cert", "tls_key", "tls_insecure_skip_verify")


def setup_http_tls(conn: dict) -> None:
    """Check the TLS files of ``conn`` (usage errors naming the option) and verify every
    https:// request of this run with them (nsqcli.client.http.configure_tls; one context)."""
    from ..client.config import TLSConfig
    from ..client.http import configure_tls

    check_tls_files(conn)
    if not any(conn.get(k) for k in HTTP_TLS_KEYS + ("tls_min_version",)):
        return
    security_hints(conn)
    configure_tls(TLSConfig(enabled=True, ca_file=conn.get("tls_ca_file"), cert_file=conn.get("tls_cert"),
                            key_file=conn.get("tls_key"), min_version=conn.get("tls_min_version"),
                            insecure_skip_verify=bool(conn.get("tls_insecure_skip_verify"))))


def check_tls_files(conn: dict) -> None:
    """A --tls-ca-file / --tls-cert / --tls-key that is empty or not PEM, and a certificate
    without its key, are usage errors naming the option and the file - before any connection."""
    from ..client.transport import pem_problem

    prefix = conn.get("option_prefix", "")
    if bool(conn.get("tls_cert")) != bool(conn.get("tls_key")):
        raise click.UsageError(f"--{prefix}tls-cert and --{prefix}tls-key go together")
    for key, kind in (("tls_ca_file", "ca"), ("tls_cert", "cert"), ("tls_key", "key")):
        path = conn.get(key)
        why = path and pem_problem(path, kind)
        if why:
            raise click.BadParameter(f"{path} {why}", param_hint=f"'--{prefix}{key.replace('_', '-')}'")


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
    check_tls_files(conn)
    secret = conn.get("auth_secret")
    if secret is not None and not secret.strip():  # `--auth-secret "$UNSET"`: no AUTH at all, silently
        raise click.BadParameter("is empty: give the secret nsqd's auth server takes, or leave the option out",
                                 param_hint=f"'--{conn.get('option_prefix', '')}auth-secret'")
    if conn.get("auth_secret_file"):
        with open(conn["auth_secret_file"], encoding="utf-8") as f:
            secret = f.read().strip()
        if not secret:  # refused before any hint about the file's mode
            prefix = conn.get("option_prefix", "")
            raise click.BadParameter(f"{conn['auth_secret_file']} is empty: it must hold the secret nsqd's auth "
                                     "server takes", param_hint=f"'--{prefix}auth-secret-file'")
    security_hints(conn)
    tls_wanted = conn.get("tls") or any(conn.get(k) for k in ("tls_ca_file", "tls_cert",
                                                              "tls_insecure_skip_verify", "tls_min_version"))
    tls = TLSConfig(enabled=bool(tls_wanted), ca_file=conn.get("tls_ca_file"), cert_file=conn.get("tls_cert"),
                    key_file=conn.get("tls_key"), min_version=conn.get("tls_min_version"),
                    insecure_skip_verify=bool(conn.get("tls_insecure_skip_verify")))
    if tls_wanted and not conn.get("option_prefix"):
        from ..client.http import configure_tls

        configure_tls(tls)  # https:// lookupd and nsqd HTTP addresses: verified the same way
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
    plain = plain_auth_warning(conn)
    if plain:
        _hint_once(plain)
    ctx = click.get_current_context(silent=True)
    name = ("dest_" if prefix else "") + "auth_secret"
    if conn.get("auth_secret") and ctx is not None and name in ctx.params:
        from click.core import ParameterSource

        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            env = "NSQCLI_" + (prefix.upper().replace("-", "_")) + "AUTH_SECRET"
            _hint_once(f"--{prefix}auth-secret on the command line is visible to every user in 'ps': use "
                       f"--{prefix}auth-secret-file or {env}")


def _is_loopback(address: str) -> bool:
    """HOST:PORT or an HTTP URL on this machine (127.0.0.0/8, ::1, localhost); a name is not
    looked up (only localhost counts)."""
    import ipaddress
    import urllib.parse

    host = urllib.parse.urlsplit(address if "://" in address else "//" + address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_auth_warning(conn: dict) -> str | None:
    """The warning for an AUTH secret that would cross the network unencrypted: a secret given
    without TLS for an nsqd (or an nsqlookupd naming the nsqd) that is not on this machine.
    On loopback nothing is said: the secret does not leave the host (and the sandbox and tests
    use AUTH there without TLS on purpose)."""
    prefix = conn.get("option_prefix", "")
    if not (conn.get("auth_secret") or conn.get("auth_secret_file")):
        return None
    if conn.get("tls") or any(conn.get(k) for k in ("tls_ca_file", "tls_cert", "tls_insecure_skip_verify",
                                                    "tls_min_version")):
        return None
    nsqd = [a for a in conn.get("nsqd_tcp_addresses") or () if not _is_loopback(a)]
    lookupd = [a for a in conn.get("lookupd_http_addresses") or () if not _is_loopback(a)]
    if nsqd:
        where = f"nsqd {nsqd[0]}" + (f" (and {len(nsqd) - 1} more)" if len(nsqd) > 1 else "")
    elif lookupd:
        where = f"the nsqd nsqlookupd {lookupd[0]} names"
    else:
        return None
    return (f"the AUTH secret goes to {where} over plain TCP, without TLS: anyone on the path can read it; "
            f"add --{prefix}tls (nsqd needs --tls-cert/--tls-key)")


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
    from .app import once_each

    ctx = click.get_current_context(silent=True)
    app = ctx.obj if ctx is not None else None
    return once_each(app.warn if app is not None else lambda text: None)


def nsqd_addresses(conn: dict) -> list[str]:
    """Explicit nsqd addresses, or the default when neither nsqd nor lookupd was given."""
    addrs = list(conn.get("nsqd_tcp_addresses") or ())
    if not addrs and not conn.get("lookupd_http_addresses"):
        addrs = [DEFAULT_NSQD]
    return addrs


def resolve_producers(app, conn: dict, topic: str, deadline: float | None = None, cancel=None) -> list[str]:
    """nsqd addresses to publish to: the explicit ones, else the nodes that lookupd says carry
    the topic (the official to_nsq cannot do this). ``cancel()`` True (a signal during a
    daemon's start) ends the lookup at once, with an NSQError and nothing said."""
    addrs = nsqd_addresses(conn)
    lookupds = list(conn.get("lookupd_http_addresses") or ())
    if addrs or not lookupds:
        return addrs
    import time

    from ..client.http import lookup_all
    from ..errors import NSQError

    timeout = 5.0 if deadline is None else max(0.001, min(5.0, deadline - time.monotonic()))
    producers, errors = lookup_all(lookupds, topic, timeout, cancel)
    if cancel is not None and cancel():
        raise NSQError("interrupted while asking nsqlookupd")
    if errors and len(errors) == len(lookupds):  # said once, as the error (not also as warnings)
        raise NSQError(f"no nsqlookupd answered ({'; '.join(map(str, errors))})")
    for e in errors:
        app.warn(str(e))
    if not producers:
        raise NSQError(f"no nsqd carries topic {topic!r} according to nsqlookupd; "
                       "give --nsqd-tcp-address to create it")
    from ..client import limits

    for p in producers:  # where their /config is, should their limits be asked
        limits.note_http(p.tcp_address, p.http_address)
    return [p.tcp_address for p in producers]


# -- TOPIC and CHANNEL: the one grammar ---------------------------------------------------------

def topic_arguments(*, many: bool = False, channel: bool | str = False, required: bool = True,
                    topic_default: str | None = None, channel_default: str | None = None,
                    topic_help: str | None = None, channel_help: str | None = None, channel_required: bool = False,
                    rest: str | None = None, rest_metavar: str = "", rest_type=None,
                    rest_min: int = 0, rest_max: int | None = None):
    """TOPIC (and CHANNEL) as arguments or with ``-t/--topic`` (``-c/--channel``), the same on
    every command. The command receives ``topic`` (``topics``, a list, when ``many``)
    and ``channel``.

    - one topic: ``CMD [TOPIC] [CHANNEL]`` or ``CMD -t TOPIC -c CHANNEL``; both forms with
      different values are a usage error, neither (when ``required``) too.
    - several topics (``many``): ``CMD [TOPIC]... -t TOPIC ...``: the union; CHANNEL only with -c.
    - ``rest``: further arguments after TOPIC (pub's MESSAGE, mpub's FILE..., replay's
      ARCHIVE..., tombstone's NODE), passed as the keyword ``rest``; with -t every argument is one
      of them (``pub -t events hello``), without it the first argument is TOPIC.
    - ``channel`` may be ``"option"``: -c only (a command whose arguments are all topics)."""
    import functools

    positional_channel = bool(channel) and channel != "option" and not many and rest is None
    meta = ("[TOPIC]..." if many else "[TOPIC]") + (" [CHANNEL]" if positional_channel else "")
    if rest:
        meta += f" {rest_metavar or rest.upper()}"
    decorators = _grammar_parameters(meta, many, channel, positional_channel, topic_default, channel_default,
                                     topic_help, channel_help)

    def decorate(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            ctx = click.get_current_context()
            words = list(kwargs.pop("grammar_args"))
            topic_opt = kwargs.pop("grammar_topic")
            channel_opt = kwargs.pop("grammar_channel", None)
            if many:
                topic, more = _many_topics(ctx, words, topic_opt, rest)
            else:
                topic, more = _one_topic(ctx, words, topic_opt, rest is not None)
                topic = topic or topic_default
            if required and not topic:
                raise click.UsageError(f"missing TOPIC ({_usage(ctx, meta)}, or -t TOPIC)", ctx)
            if positional_channel:
                channel_value = _same(ctx, "CHANNEL", "-c", more.pop(0) if more else None, channel_opt, CHANNEL)
            else:
                channel_value = channel_opt
            if channel_required and not channel_value:
                raise click.UsageError(f"missing CHANNEL ({_usage(ctx, meta)}, or -c CHANNEL)", ctx)
            if channel:
                kwargs["channel"] = channel_value or channel_default
            if rest is not None:
                kwargs["rest"] = _rest(ctx, more, rest, rest_metavar, rest_type, rest_min, rest_max)
            elif more:
                raise click.UsageError(f"too many arguments: {' '.join(more)!r} ({_usage(ctx, meta)})", ctx)
            kwargs["topics" if many else "topic"] = topic
            return f(*args, **kwargs)

        for d in reversed(decorators):
            wrapper = d(wrapper)
        return wrapper

    return decorate


def _grammar_parameters(meta: str, many: bool, channel, positional_channel: bool, topic_default, channel_default,
                        topic_help, channel_help) -> list:
    """The click parameters of :func:`topic_arguments`: the words, -t/--topic, -c/--channel."""
    topic_help = topic_help or ("Topic (repeatable; or as arguments)." if many else "Topic (or the first argument).")
    decorators = [
        click.argument("grammar_args", nargs=-1, metavar=meta),
        option("-t", "--topic", "grammar_topic", multiple=many, type=TOPIC, help=topic_help,
               show_default=topic_default if topic_default else False, default=None),
    ]
    if channel:
        where = " (or the second argument)" if positional_channel else ""
        decorators.append(option("-c", "--channel", "grammar_channel", type=CHANNEL, default=None,
                                 show_default=channel_default if channel_default else False,
                                 help=(channel_help or "Channel.") + where))
    return decorators


def _usage(ctx: click.Context, meta: str) -> str:
    """``nsqcli pub TOPIC [MESSAGE]``: the usage with TOPIC as the required word it is."""
    return f"{ctx.command_path} {meta.replace('[TOPIC]', 'TOPIC', 1)}".strip()


def _same(ctx, what: str, flag: str, word: str | None, given, kind):
    """An argument and its option: one of them, or both with the same value."""
    if word is None:
        return given
    value = _convert(kind, word, ctx, what)
    if given is not None and given != value:
        raise click.UsageError(f"{what} given twice: {value!r} as an argument and {given!r} with {flag} "
                               "(give it once)", ctx)
    return value


def _one_topic(ctx, words: list, topic_opt, has_rest: bool):
    if topic_opt is not None and has_rest:
        return topic_opt, words  # `pub -t events hello`: every argument is a MESSAGE
    return _same(ctx, "TOPIC", "-t", words.pop(0) if words else None, topic_opt, TOPIC), words


def _many_topics(ctx, words: list, topic_opt, rest: str | None):
    if rest is not None and not topic_opt:
        first = [words.pop(0)] if words else []
    elif rest is not None:
        first = []
    else:
        first, words = words, []
    topics = [_convert(TOPIC, w, ctx, "TOPIC") for w in first] + list(topic_opt or ())
    return list(dict.fromkeys(topics)), words


def _rest(ctx, words: list, name: str, metavar: str, kind, lo: int, hi: int | None):
    import re

    label = (re.findall(r"[A-Z][A-Z_]+", metavar) or [name.upper()])[0]  # "-- COMMAND [ARG]...": COMMAND
    if len(words) < lo:
        raise click.UsageError(f"missing {label} ({ctx.command_path} [TOPIC] {metavar})", ctx)
    if hi is not None and len(words) > hi:
        quote = f"quote a {label} with spaces; " if hi == 1 else ""
        raise click.UsageError(f"too many arguments: {' '.join(words)!r} ({quote}TOPIC is given once, as the "
                               "first argument or with -t)", ctx)
    return [_convert(kind, w, ctx, label) for w in words] if kind is not None else words


def _convert(kind, word: str, ctx, hint: str):
    try:
        return kind.convert(word, None, ctx)
    except click.BadParameter as e:
        e.param_hint = hint
        raise


# -- --timeout: one deadline for the whole command ----------------------------------------------

def timeout_option(help: str = "Give up (exit 3) if the work is not done by then."):
    """``--timeout DURATION``: the same flag wherever a command can wait."""
    return option("--timeout", type=DURATION, default=None, help=help)


def daemon_options(*, count_help: str | None = None, timeout: bool = True, as_json: bool = True,
                   status_interval: str = "60s", live_help: str = "", log_format: str = "plain"):
    """The options every long-running command shares (nsqcli.cli.harness runs them), with one
    meaning everywhere: -n, --idle-timeout, --timeout, --live/--no-live, --json,
    --status-interval, --metrics-address, --status-file, --log-format, --log-level. ``None`` for
    ``count_help``/``timeout``/``as_json`` leaves that flag out (to-file runs until stopped)."""
    decorators = []
    if count_help is not None:
        decorators.append(option("-n", "--count", type=click.IntRange(0), default=0, help=count_help))
    if timeout:
        decorators += [
            option("--idle-timeout", type=DURATION, help="Stop after no message for this long (0 is refused)."),
            timeout_option("Stop after this long (0 is refused); with -n, exit 3 if fewer than N were done by then."),
        ]
    decorators.append(option("--live/--no-live", default=None, help=live_help or (
        "Live table of the connections on stderr (default: when stderr is a terminal that can draw one; "
        "elsewhere status lines).")))
    if as_json:
        decorators.append(option("--json", "as_json", is_flag=True,
                                 help="At the end, the summary as one JSON line on stdout."))
    decorators += [
        option("--status-interval", type=DURATION, default=status_interval, show_default=True,
               help="Without the live table: a status line this often, with the lag nsqd reports (0 = off)."),
        option("--metrics-address", type=LISTEN_ADDRESS, metavar="HOST:PORT", group="Monitoring",
               help="Serve Prometheus metrics on http://HOST:PORT/metrics and health on /healthz "
                    "(200 while working or idle, 503 with the reason)."),
        option("--status-file", type=click.Path(dir_okay=False), metavar="PATH", group="Monitoring",
               help="Keep the metrics as JSON in PATH, replaced atomically every 5 s."),
        option("--log-format", type=click.Choice(["plain", "text", "json"]), default=log_format,
               show_default=True, group="Monitoring",
               help="plain: 'nsqcli: ...' lines; text: timestamped log lines (UTC, ms, pid); json: one "
                    "object a line."),
        option("--log-level", type=click.Choice(["debug", "info", "warn", "error"]), default="info",
               show_default=True, group="Monitoring", help="The least important lines said on stderr."),
    ]

    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


def pop_run(kwargs: dict):
    """The shared run options (:func:`daemon_options`) as harness Settings, checked; ``count``
    stays in ``kwargs``."""
    from .harness import Settings

    timeout = kwargs.pop("timeout", None)
    idle = kwargs.pop("idle_timeout", None)
    check_timeout(timeout)
    if idle is not None and idle <= 0:
        raise click.BadParameter("must be more than 0 (leave it out for no idle limit)", param_hint="'--idle-timeout'")
    status_file = kwargs.pop("status_file", None)
    if status_file is not None:  # (an empty one is refused, not ignored)
        from ..daemon.statusfile import StatusFile

        try:
            StatusFile.check(status_file)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--status-file'") from None
    return Settings(live=kwargs.pop("live", None), status_interval=kwargs.pop("status_interval", 0.0),
                    as_json=kwargs.pop("as_json", False), deadline=deadline_of(timeout), idle_timeout=idle,
                    metrics_address=kwargs.pop("metrics_address", None), status_file=status_file,
                    log_format=kwargs.pop("log_format", "plain"), log_level=kwargs.pop("log_level", "info"))


from ..clock import deadline_of  # noqa: E402,F401 - --timeout counted from process start


def check_timeout(timeout: float | None, endless: bool = True) -> None:
    """``endless``: leaving --timeout out means no deadline (else the command has a default one)."""
    if timeout is not None and timeout <= 0:
        hint = "leave it out for no deadline" if endless else "there is no endless wait: give a longer one, e.g. 10m"
        raise click.BadParameter(f"must be more than 0 ({hint})", param_hint="'--timeout'")
