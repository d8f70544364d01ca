"""``nsqcli doctor``: check the configured cluster and settings, with the fix for each failure."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import click

from ..command import command, option
from ...clock import left as _left  # most seconds, or what is left of --timeout
from ..options import (build_config, check_timeout, connection_options, deadline_of, nsqd_addresses,
                       pop_connection, timeout_option, topic_arguments)
from ..types import HTTP_ADDRESS

OK, WARN, FAIL = "ok", "warn", "fail"
#: each HTTP request of a check (nodes are checked at once: a hung one costs this once or twice)
HTTP_TIMEOUT = 3.0
#: the fix for a server that accepts connections and then says nothing
HUNG = "it accepts connections but does not answer: is the process stopped (SIGSTOP, a debugger) or overloaded?"


@dataclass
class Check:
    target: str
    status: str
    detail: str
    fix: str = ""


def _spark_check() -> Check | None:
    """What the installed pyspark supports (only when the spark extra is there): a warning for
    a pyspark the extra does not support, or one without admission control."""
    from ...spark_features import features, installed, source_available_now_in_batches

    version = installed()
    if version is None:
        return None
    can = features(version)
    detail = "; ".join(f"{k}: {v}" for k, v in can.items())
    if "nsq source" not in can:
        return Check(f"pyspark {version}", WARN, detail, "pip install 'pyspark>=4.0,<5'")
    if not source_available_now_in_batches(version):
        return Check(f"pyspark {version}", WARN, detail,
                     "for trigger(availableNow=True) in batches of maxMessagesPerBatch: pyspark >= 4.2")
    return Check(f"pyspark {version}", OK, detail)


def _tcp_check(address: str, cfg, deadline: float | None = None) -> Check:
    from ...client.conn import Connection
    from ...errors import AuthError, NSQError, TransportError

    target = f"nsqd {address} (TCP)"
    t0 = time.monotonic()
    said = _Said()
    try:
        conn = Connection(address, cfg, said).connect(deadline=deadline)
    except AuthError as e:
        return Check(target, FAIL, str(e), "give --auth-secret-file FILE (or NSQCLI_AUTH_SECRET), or save it in the context")
    except NSQError as e:
        text = str(e)
        if isinstance(e, TransportError) and e.fix:  # a TLS failure named by its cause (transport)
            return Check(target, FAIL, e.reason, e.fix)
        if "HTTP/" in text or "400 Bad Request" in text or "HTTP server" in text:
            return Check(target, FAIL, f"answered in HTTP: this is an HTTP port ({text[:80]})",
                         "give nsqd's TCP port (usually 4150) to --nsqd-tcp-address")
        if "TLS required" in text:
            return Check(target, FAIL, text, "this nsqd requires TLS (--tls-required): add --tls (and --tls-ca-file "
                                             "with the CA that signed its certificate)")
        if "TLS" in text or "SSL" in text:
            return Check(target, FAIL, text, "match nsqd's TLS setting: --tls (with --tls-ca-file) or without it")
        if "E_BAD_PROTOCOL" in text or "'  V1'" in text or "V1 protocol" in text:
            return Check(target, FAIL, f"not nsqd's TCP protocol: {text[:100]}",
                         "this may be nsqlookupd's TCP port (4160); nsqd's TCP port is usually 4150")
        if isinstance(e, TimeoutError):
            if deadline is not None and time.monotonic() >= deadline - 0.05:
                return Check(target, FAIL, f"not done before --timeout ({text})", "give a longer --timeout")
            return Check(target, FAIL, text, HUNG)
        return Check(target, FAIL, text, "is nsqd running and is this its TCP address (usually port 4150)?")
    ms = (time.monotonic() - t0) * 1000
    n = conn.negotiated
    parts = [f"v{n.version}" if n.version else "version unknown", f"handshake {ms:.0f} ms",
             "TLS" if n.tls else "no TLS", f"compression {n.compression or 'none'}",
             f"max RDY {n.max_rdy_count}", f"msg timeout {n.msg_timeout:g}s"]
    status, fix = OK, ""
    if n.auth_required:
        ident = (conn.auth_info or {}).get("identity") or "?"
        parts.append(f"AUTH ok as {ident!r}")
    elif cfg.auth_secret:
        status, fix = WARN, "nsqd does not use AUTH: the secret was not sent; is this the cluster you meant?"
        parts.append("no AUTH")
    else:
        parts.append("no AUTH")
    if cfg.tls.enabled is False and "tls_v1" in (n.features or {}) and n.features.get("tls_v1"):
        parts.append("TLS available (not asked)")
    if not n.tls and "TLS required" in said.probe(conn):
        status, fix = FAIL, ("add --tls (and --tls-ca-file with the CA that signed its certificate): "
                             "this nsqd requires TLS (--tls-required)")
        parts.append("TLS required: PUB and SUB without it are refused")
    conn.close(timeout=2)
    return Check(target, status, ", ".join(parts), fix)


class _Said:
    """A connection delegate that keeps what nsqd said after the handshake."""

    def __init__(self):
        import threading

        self.error = ""
        self.event = threading.Event()

    def on_messages(self, conn, msgs, nbytes):
        pass

    def on_response(self, conn, data):
        pass

    def on_server_error(self, conn, err):
        self.error = self.error or str(err)
        self.event.set()

    def on_close(self, conn, error):
        if error is not None:
            self.error = self.error or str(error)
        self.event.set()

    def probe(self, conn, wait: float = 0.3) -> str:
        """Send NOP (answered by nothing, or by E_INVALID "cannot NOP in current state (TLS
        required)" from an nsqd with --tls-required: IDENTIFY is the one command it takes
        without TLS) and return what nsqd said within ``wait`` seconds."""
        from ...errors import NSQError
        from ...protocol import encode_nop

        try:
            conn.send(encode_nop())
        except NSQError as e:
            return str(e)
        self.event.wait(wait)
        return self.error


def _http_check(address: str, topic: str | None, deadline: float | None = None, target: str = "",
                derived_from: str = "") -> tuple[Check, dict]:
    """nsqd's HTTP API at ``address``; ``derived_from``: the nsqd TCP address whose port + 1
    ``address`` is (then its /info must name that TCP port, or it is another nsqd's)."""
    from ...client.http import base_url, http_get, http_json, tls_required_port
    from ...errors import NSQError

    target = target or f"nsqd {address} (HTTP)"
    try:
        status, headers, body = http_get(address, "/info", timeout=_left(deadline, HTTP_TIMEOUT))
        info = json.loads(body or b"{}")
    except NSQError as e:
        return _info_failed(target, str(e), deadline), {}
    except ValueError:
        return Check(target, FAIL, f"/info is not JSON: {body[:60]!r}", "is this nsqd's HTTP address?"), {}
    https_port = tls_required_port(status, body)
    if https_port is not None and base_url(address).startswith("http://"):
        return _https_instead(address, https_port, topic, deadline, target, derived_from)
    if status != 200 or "tcp_port" not in info:
        return Check(target, FAIL, f"/info answered HTTP {status} without nsqd's fields ({str(info)[:60]})",
                     "this looks like nsqlookupd or another server: give nsqd's HTTP port (usually 4151)"), {}
    parts = [f"v{info.get('version', '?')}", f"TCP port {info.get('tcp_port')}"]
    status_, fix = _clock_skew(headers, parts)
    try:
        stats = http_json(address, "/stats", {"format": "json"} | ({"topic": topic} if topic else {}),
                          timeout=_left(deadline, HTTP_TIMEOUT))
        topics = (stats or {}).get("topics") or []
        chans = sum(len(t.get("channels") or []) for t in topics)
        parts.append(f"{len(topics)} topics, {chans} channels" if not topic else "")
    except NSQError as e:
        return Check(target, FAIL, f"/stats failed: {e}", "check nsqd's log"), info
    if topic:
        status_, fix = _topic_part(topic, topics, parts, status_, fix)
    mismatch = _derived_mismatch(derived_from, info.get("tcp_port"))
    if mismatch:
        parts[1] = mismatch
        status_ = WARN
        fix = "; ".join(f for f in (f"give nsqd {derived_from}'s HTTP address with --nsqd-http-address (its "
                                    "TCP port + 1 is another nsqd's, or a port forward's)", fix) if f)
    return Check(target, status_, ", ".join(p for p in parts if p), fix), info


def _info_failed(target: str, text: str, deadline: float | None) -> Check:
    """nsqd's /info could not be asked: the failure with the fix its words point to."""
    fix = ("this port speaks TCP: give nsqd's HTTP port (usually 4151)"
           if "not an HTTP answer" in text or "reset by peer" in text
           else "" if "TLS" in text  # the TLS failure's own fix is in the text
           else HUNG if "no complete answer within" in text
           else "is nsqd running and is this its HTTP address (usually port 4151)?")
    if fix == HUNG and deadline is not None and time.monotonic() >= deadline - 0.05:
        fix = "not done before --timeout: give a longer --timeout"
    if "TLS" in text and ": give " in text:
        text, _, fix = text.partition(": give ")
        fix = "give " + fix
    return Check(target, FAIL, text, fix)


def _https_instead(address: str, https_port, topic, deadline, target: str, derived_from: str) -> tuple[Check, dict]:
    """nsqd --tls-required: its HTTP API is on HTTPS only; check that instead, and say so."""
    from ...client.http import base_url

    host = base_url(address)[len("http://"):].rsplit(":", 1)[0]
    https = f"https://{host}:{https_port}"
    check, info = _http_check(https, topic, deadline, target, derived_from)
    note = f"this nsqd requires TLS for its HTTP API (403 TLS_REQUIRED): use {https}"
    if check.status == FAIL:
        return Check(target, FAIL, f"{note}; there: {check.detail}", check.fix), info
    return Check(target, check.status, f"{check.detail}, HTTPS only: {https}", check.fix), info


def _clock_skew(headers, parts: list) -> tuple[str, str]:
    """The clock skew against nsqd's Date header, added to ``parts``: (status, fix)."""
    from email.utils import parsedate_to_datetime

    status, fix = OK, ""
    if headers.get("date"):
        try:
            # Date has whole seconds: nsqd's clock was somewhere in [date, date + 1)
            skew = time.time() - (parsedate_to_datetime(headers["date"]).timestamp() + 0.5)
            whole = round(skew)
            parts.append(f"clock skew {whole:+d}s (±1s)" if whole else "clock skew 0s (±1s)")
            if abs(skew) > 2:
                status, fix = WARN, ("this machine's clock and nsqd's differ: message timestamps, --since/--until "
                                     "and rates will be off; run NTP on both")
        except (TypeError, ValueError):
            pass
    return status, fix


def _topic_part(topic: str, topics: list, parts: list, status: str, fix: str) -> tuple[str, str]:
    """--topic on this nsqd (depth, channels, paused), added to ``parts``: (status, fix)."""
    mine = [t for t in topics if t.get("topic_name") == topic]
    if mine:
        t = mine[0]
        names = [c.get("channel_name") for c in t.get("channels") or []]
        parts.append(f"topic {topic!r}: depth {t.get('depth', 0)}, channels {', '.join(names) or 'none'}")
        if t.get("paused"):
            status, fix = WARN, f"topic {topic!r} is paused: nothing is delivered until it is unpaused"
    else:
        parts.append(f"no topic {topic!r}")
    return status, fix


def _derived_mismatch(derived_from: str, tcp_port) -> str:
    """'' when ``derived_from`` (an nsqd TCP address; '' when the HTTP address was given) has
    the TCP port that /info named, else the mismatch in words (both ports)."""
    from ...client.transport import split_address

    if not derived_from:
        return ""
    try:
        _, port = split_address(derived_from)
    except ValueError:
        return ""
    if tcp_port == port:
        return ""
    return (f"TCP port {tcp_port}, not {port}: this is not the HTTP port of nsqd {derived_from} "
            "(taken as its TCP port + 1)")


def _at_once(jobs: list[tuple[str, object]], timeout: float, empty, deadline: float | None = None
             ) -> list[tuple[Check, object]]:
    """Run the checks ``jobs`` ([(target, fn)], fn() -> (Check, extra)) at once; a check still
    running after ``timeout`` (or at ``deadline``) fails as unreachable, with ``empty`` as its extra."""
    from ...client.fanout import ask_all
    from ...client.http import seconds

    if not jobs:
        return []
    timeout = _left(deadline, timeout)
    answers = ask_all([fn for _, fn in jobs], lambda fn: fn(), timeout, catch=(),
                      slack=0.5 if deadline is None else 0.1)
    late = deadline is not None and time.monotonic() >= deadline - 0.05
    return [a.value if a.ok else (Check(target, FAIL, f"no answer within {seconds(timeout)}",
                                        "not done before --timeout: give a longer --timeout" if late else HUNG), empty)
            for (target, _), a in zip(jobs, answers)]


def _lookupd_check(address: str, deadline: float | None = None) -> tuple[Check, list]:
    from ...client.http import http_json
    from ...errors import NSQError

    target = f"nsqlookupd {address}"
    try:
        info = http_json(address, "/info", timeout=_left(deadline, HTTP_TIMEOUT)) or {}
    except NSQError as e:
        text = str(e)
        fix = ("this port speaks TCP: give nsqlookupd's HTTP port (usually 4161)"
               if "not an HTTP answer" in text or "reset by peer" in text
               else "" if "TLS" in text
               else HUNG if "no complete answer within" in text
               else "is nsqlookupd running and is this its HTTP address (usually port 4161)?")
        if "TLS" in text and ": give " in text:
            text, _, fix = text.partition(": give ")
            fix = "give " + fix
        return Check(target, FAIL, text, fix), []
    if not isinstance(info, dict) or "tcp_port" in info or "version" not in info:
        return Check(target, FAIL, "answered, but not as nsqlookupd" + (" (it is an nsqd)" if isinstance(info, dict)
                                                                        and "tcp_port" in info else ""),
                     "give nsqlookupd's HTTP port (usually 4161); nsqd HTTP addresses go to --nsqd-http-address"), []
    try:
        nodes = (http_json(address, "/nodes", timeout=_left(deadline, HTTP_TIMEOUT)) or {}).get("producers") or []
        topics = (http_json(address, "/topics", timeout=_left(deadline, HTTP_TIMEOUT)) or {}).get("topics") or []
    except (NSQError, AttributeError) as e:
        return Check(target, FAIL, f"/nodes or /topics failed: {e}", "check nsqlookupd's log"), []
    status, fix = OK, ""
    if not nodes:
        status, fix = WARN, "no nsqd is registered: start nsqd with --lookupd-tcp-address HOST:4160"
    return Check(target, status, f"v{info.get('version')}, {len(nodes)} nsqd registered, {len(topics)} topics", fix), nodes


@command(examples="""
nsqcli doctor                                  # the selected context, flags or NSQCLI_* settings
nsqcli doctor --context prod -t events         # also: where 'events' lives, its depth and channels
nsqcli doctor --json | jq '.checks[] | select(.status != "ok")'
""")
@topic_arguments(required=False, topic_help="Also check this topic on every nsqd (or the first argument).")
@option("--nsqd-http-address", "nsqd_http", multiple=True, type=HTTP_ADDRESS, envvar="NSQCLI_NSQD_HTTP_ADDRESS",
        show_envvar=True, group="Connection", help="nsqd HTTP address to check (default: lookupd's nodes, or TCP port + 1).")
@option("--json", "as_json", is_flag=True, help="The checks as one JSON line on stdout.")
@timeout_option("Give up by then, counted from the start: checks not done fail, exit 3.")
@connection_options()
@click.pass_obj
def doctor(app, topic, nsqd_http, as_json, timeout, **kwargs):
    """Check every nsqd and nsqlookupd of the configured context (or flags): reachable, the right
    port (TCP vs HTTP), version, TLS/compression/AUTH as negotiated, clock skew against nsqd, and
    which topics and channels exist. Prints a checklist with the fix for each failure; exit 1 if
    anything failed (warnings do not fail), 3 if --timeout passed before every check was done.

    https:// HTTP addresses are verified with --tls-ca-file/--tls-cert/--tls-key; an nsqd started
    with --tls-required (its HTTP API on HTTPS only) is checked on its HTTPS port.
    """
    check_timeout(timeout)
    deadline = deadline_of(timeout)
    conn = pop_connection(kwargs)
    cfg = build_config(conn)
    cfg = type(cfg)(**{**cfg.__dict__, "on_notice": None})
    checks: list[Check] = []
    if app.context:
        checks.append(Check(f"context {app.context}", OK, "settings from the context (flags and NSQCLI_* override)"))
    tcp = list(nsqd_addresses(conn))
    http, derived = _http_addresses(tcp, nsqd_http)
    # every node at once, each check under its own deadline: a hung node costs one deadline
    lookupds = list(conn.get("lookupd_http_addresses") or ())
    for check, nodes in _at_once([(f"nsqlookupd {a}", lambda a=a: _lookupd_check(a, deadline)) for a in lookupds],
                                 3 * HTTP_TIMEOUT, [], deadline):
        checks.append(check)
        for n in nodes:
            host = n.get("broadcast_address")
            tcp.append(f"{host}:{n.get('tcp_port')}")
            http.append(f"{host}:{n.get('http_port')}")
            derived.pop(f"{host}:{n.get('http_port')}", None)  # nsqlookupd said so
    jobs = [(f"nsqd {a} (TCP)", lambda a=a: (_tcp_check(a, cfg, deadline), None)) for a in dict.fromkeys(tcp)]
    jobs += [(f"nsqd {a} (HTTP)", lambda a=a: _http_check(a, topic, deadline, derived_from=derived.get(a, "")))
             for a in dict.fromkeys(http)]
    checks += [check for check, _ in _at_once(jobs, max(cfg.dial_timeout + cfg.handshake_timeout,
                                                         2 * HTTP_TIMEOUT), None, deadline)]
    if topic and not any(f"topic {topic!r}:" in c.detail for c in checks):
        checks.append(Check(f"topic {topic}", WARN, "no nsqd has it yet",
                            "it is created by the first publish (or 'nsqcli pub' to a given nsqd)"))
    spark = _spark_check()  # last: the estate first
    if spark is not None:
        checks.append(spark)
    _report(app, checks, as_json, deadline)
    return 0


def _http_addresses(tcp: list, nsqd_http) -> tuple[list, dict]:
    """The nsqd HTTP addresses to check: those given, else by convention each TCP port + 1
    (confirmed by its /info). (addresses, {derived HTTP address: the TCP address it came from})."""
    from ...client.transport import split_address

    http = list(nsqd_http)
    derived: dict[str, str] = {}  # HTTP address -> the TCP address it was derived from
    if not nsqd_http:
        for a in tcp:
            try:
                host, port = split_address(a)
            except ValueError:
                continue
            guess = (f"[{host}]" if ":" in host else host) + f":{port + 1}"
            http.append(guess)
            derived.setdefault(guess, a)
    return http, derived


def _report(app, checks: list, as_json: bool, deadline: float | None) -> None:
    """The checklist (or JSON) on stdout; exit 1 if a check failed, 3 if --timeout passed first."""
    from ..app import write_stdout

    failed = [c for c in checks if c.status == FAIL]
    if as_json:
        write_stdout(json.dumps({"ok": not failed, "context": app.context,
                                 "checks": [asdict(c) for c in checks]}) + "\n")
    else:
        write_stdout(_render(checks, tty=app.stderr_is_tty and _stdout_tty()))
    if failed:
        from ...errors import NSQError

        if deadline is not None and time.monotonic() >= deadline - 0.05:
            from ..app import DeadlineExceeded

            raise DeadlineExceeded(f"--timeout passed before every check was done "
                                   f"({len(failed)} of {len(checks)} checks failed)")
        raise NSQError(f"{len(failed)} of {len(checks)} checks failed")


def _stdout_tty() -> bool:
    import sys

    return sys.stdout.isatty()


def _render(checks: list[Check], tty: bool) -> str:
    marks = {OK: "✓", WARN: "!", FAIL: "✗"} if tty else {OK: "ok  ", WARN: "warn", FAIL: "FAIL"}
    lines = []
    for c in checks:
        lines.append(f"{marks[c.status]} {c.target}: {c.detail}")
        if c.fix:
            lines.append(f"    fix: {c.fix}")
    ok = sum(c.status == OK for c in checks)
    lines.append(f"{ok} ok, {sum(c.status == WARN for c in checks)} warnings, "
                 f"{sum(c.status == FAIL for c in checks)} failed")
    return "\n".join(lines) + "\n"
