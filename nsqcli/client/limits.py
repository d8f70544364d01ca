"""What each nsqd allows, asked of it rather than guessed: ``GET /config/<option>`` on its HTTP
port (every nsqd 1.0-1.3) and the IDENTIFY answer of each connection, kept per TCP address for
the life of the process.

- :func:`ask` (blocking; a caller's thread or ``workers.BLOCKING``, never the I/O loop) finds an
  nsqd's HTTP address - told by nsqlookupd (:func:`note_http`), else nsqd's default layout
  (TCP port + 1) confirmed by its ``/info`` naming that TCP port - and asks ``/config`` for
  every option in :data:`OPTIONS` at once, all under one short deadline and the caller's.
  An option an older nsqd does not have (``min_output_buffer_timeout`` before 1.2) is None.
- :func:`note_identify` records what a connection's IDENTIFY answer said of nsqd (max_rdy_count,
  max_msg_timeout, version, the output buffer it granted; the msg_timeout it granted is the
  connection's own, on Connection.negotiated).
- :func:`known` returns what is known without asking (never blocks): the connection's
  handshake uses it to fit its output buffer timeout into nsqd's range (:func:`fit_identify`).
- :func:`refused` remembers an IDENTIFY value an nsqd refused (``E_BAD_BODY IDENTIFY output
  buffer timeout (50) is invalid``: nsqd >= 1.2 started with --min-output-buffer-timeout above
  50 ms), so every later connection to that address asks for nsqd's default instead, and
  learns the range in the background for the connections after that.

Imports nothing heavy (the `nsqcli pub` fast path imports this through conn.py).
"""

from __future__ import annotations

import threading
import time

#: the /config options asked (nsqd's flag names with '_'), and which are durations (ns in JSON)
OPTIONS = ("max_msg_size", "max_body_size", "max_rdy_count", "min_output_buffer_timeout",
           "max_output_buffer_timeout", "max_output_buffer_size", "max_req_timeout", "mem_queue_size",
           "msg_timeout", "max_msg_timeout")
_DURATIONS = frozenset(("min_output_buffer_timeout", "max_output_buffer_timeout", "max_req_timeout",
                        "msg_timeout", "max_msg_timeout"))
#: the whole of one ask when the caller has no tighter deadline (a loopback nsqd answers in ms)
ASK_TIMEOUT = 2.0
#: nsqd's defaults (options.go, v1.3) where nothing better is known
DEFAULTS = {"max_msg_size": 1024 * 1024, "max_body_size": 5 * 1024 * 1024, "max_rdy_count": 2500,
            "max_req_timeout": 3600.0, "msg_timeout": 60.0}


class Limits:
    """One nsqd's limits as far as known (None: not known). Sizes in bytes, times in seconds.
    ``source`` says where they came from: "config" (/config answered), "identify" (only a
    connection's IDENTIFY answer), or "" (nothing yet)."""

    __slots__ = ("address", "http_address", "source", "version", "output_buffer_timeout",
                 "output_buffer_size", "error") + OPTIONS

    def __init__(self, address: str, **values):
        self.address = address
        self.http_address = None
        self.source = ""
        self.version = ""
        self.output_buffer_timeout = None   # what nsqd granted in IDENTIFY (seconds; 0 = off)
        self.output_buffer_size = None
        self.error = None                   # why /config could not be asked (a sentence)
        for name in OPTIONS:
            setattr(self, name, None)
        for name, value in values.items():
            setattr(self, name, value)

    def copy(self) -> "Limits":
        new = Limits(self.address)
        for name in self.__slots__:
            setattr(new, name, getattr(self, name))
        return new

    def get(self, name: str):
        """The value, else nsqd's default (:data:`DEFAULTS`), else None."""
        value = getattr(self, name)
        return DEFAULTS.get(name) if value is None else value

    @property
    def max_message(self) -> int | None:
        """The largest message one MPUB can carry: --max-msg-size, and within --max-body-size
        with MPUB's 8 bytes of framing (count + size). None when /config was not answered."""
        if self.max_msg_size is None:
            return None
        if self.max_body_size is None:
            return self.max_msg_size
        return max(0, min(self.max_msg_size, self.max_body_size - 8))

    def fit_output_buffer_timeout(self, wanted_ms: int) -> int:
        """``wanted_ms`` moved into nsqd's [min, max] range when the range is known (0 and -1
        are always accepted: nsqd's default, off)."""
        if wanted_ms <= 0:
            return wanted_ms
        lo = self.min_output_buffer_timeout
        hi = self.max_output_buffer_timeout
        if lo is not None:
            wanted_ms = max(wanted_ms, _ms_up(lo))
        if hi is not None and hi > 0:
            wanted_ms = min(wanted_ms, max(1, int(hi * 1000)))
        return max(1, wanted_ms)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        known = ", ".join(f"{n}={getattr(self, n)!r}" for n in OPTIONS if getattr(self, n) is not None)
        return f"<Limits {self.address} {self.source or 'unknown'}{': ' + known if known else ''}>"


def _ms_up(seconds: float) -> int:
    ms = seconds * 1000
    return int(ms) + (1 if ms != int(ms) else 0)


_lock = threading.Lock()
_known: dict[str, Limits] = {}       # tcp address -> what is known
_http: dict[str, str | None] = {}    # tcp address -> http address (None: looked for, not found)
_refused: dict[str, set] = {}        # tcp address -> IDENTIFY fields nsqd refused
_learning: set = set()               # addresses whose /config is being asked in the background


def known(address: str) -> Limits:
    """What is known of ``address`` (a copy; never blocks, never asks)."""
    with _lock:
        lim = _known.get(address)
        return lim.copy() if lim is not None else Limits(address)


def value(address: str, name: str):
    """One of ``address``'s limits as far as known (None: not known), without copying the rest:
    for per-message paths (a REQ's delay cap)."""
    lim = _known.get(address)  # one dict read and one attribute read: atomic under the GIL
    return None if lim is None else getattr(lim, name)


def note_http(address: str, http_address: str) -> None:
    """nsqd ``address`` (TCP) answers HTTP at ``http_address`` (nsqlookupd said so)."""
    if address and http_address:
        with _lock:
            _http[address] = http_address


def note_identify(address: str, negotiated) -> None:
    """A connection's IDENTIFY answer (protocol.session.Negotiated)."""
    f = getattr(negotiated, "features", None) or {}
    with _lock:
        lim = _known.setdefault(address, Limits(address))
        if not lim.source:
            lim.source = "identify"
        if f.get("max_rdy_count"):
            lim.max_rdy_count = f["max_rdy_count"]
        if f.get("max_msg_timeout"):
            lim.max_msg_timeout = f["max_msg_timeout"] / 1000.0
        if f.get("version"):
            lim.version = f["version"]
        if "output_buffer_timeout" in f:
            lim.output_buffer_timeout = f["output_buffer_timeout"] / 1000.0
        if "output_buffer_size" in f:
            lim.output_buffer_size = f["output_buffer_size"]


def fit_identify(address: str, body: dict) -> dict:
    """The IDENTIFY ``body`` for ``address``, changed where this nsqd is known to refuse it: a
    field it refused before is left to nsqd's default, an output buffer timeout is moved into
    its /config range, an output buffer size kept within its maximum. Never blocks."""
    with _lock:
        refused = _refused.get(address)
        lim = _known.get(address)
        if refused is None and lim is None:
            return body
        refused = set(refused or ())
        lim = lim.copy() if lim is not None else None
    for name in refused:
        if name in body:
            body[name] = 0 if name in ("output_buffer_timeout", "output_buffer_size") else body[name]
    if lim is not None:
        t = body.get("output_buffer_timeout")
        if isinstance(t, int) and t > 0 and "output_buffer_timeout" not in refused:
            body["output_buffer_timeout"] = lim.fit_output_buffer_timeout(t)
        size = body.get("output_buffer_size")
        if isinstance(size, int) and size > 0 and lim.max_output_buffer_size:
            body["output_buffer_size"] = max(64, min(size, lim.max_output_buffer_size))
    return body


def refused(address: str, field: str, learn: bool = True) -> None:
    """nsqd ``address`` refused IDENTIFY ``field``: later connections leave it to nsqd's default;
    with ``learn``, /config is asked in the background (workers.BLOCKING) so that connections
    after that fit into its range instead."""
    with _lock:
        _refused.setdefault(address, set()).add(field)
        start = learn and address not in _learning and (address not in _known or _known[address].source != "config")
        if start:
            _learning.add(address)
    if start:
        from . import workers  # here: loads logging, which `nsqcli pub` must not on its fast path

        workers.BLOCKING.submit(lambda: _learn(address))


def _learn(address: str) -> None:
    try:
        ask([address], timeout=ASK_TIMEOUT)
        with _lock:
            lim = _known.get(address)
            if lim is not None and lim.source == "config" and lim.min_output_buffer_timeout is not None:
                # the range is known now: fit into it rather than fall back to nsqd's default
                _refused.get(address, set()).discard("output_buffer_timeout")
    finally:
        with _lock:
            _learning.discard(address)


def ask(addresses, timeout: float = ASK_TIMEOUT, deadline: float | None = None,
        refresh: bool = False) -> dict[str, Limits]:
    """Each nsqd's limits from its /config (blocking; at most ``timeout`` seconds and until
    ``deadline``, time.monotonic(), all addresses at once). Answers already known are not
    asked again unless ``refresh``. An nsqd whose HTTP port cannot be found or that does not
    answer keeps what its IDENTIFY answers said, with ``error`` saying why."""
    addresses = list(dict.fromkeys(addresses))
    end = time.monotonic() + timeout
    if deadline is not None:
        end = min(end, deadline)
    with _lock:
        todo = [a for a in addresses if refresh or a not in _known or _known[a].source != "config"]
    if todo and end > time.monotonic():
        _ask(todo, end)
    return {a: known(a) for a in addresses}


def _ask(addresses: list[str], end: float) -> None:
    from .fanout import ask_all

    left = end - time.monotonic()
    if left <= 0:
        return
    http = dict(zip(addresses, (a.value if a.ok else None for a in
                                ask_all(addresses, lambda a: _http_address(a, end), left, slack=0.1))))
    pairs = [(a, name) for a in addresses if http.get(a) for name in OPTIONS]
    left = end - time.monotonic()
    answers = ask_all(pairs, lambda p: _config(http[p[0]], p[1], end), max(0.0, left), slack=0.1) if pairs else []
    got: dict[str, dict] = {}
    errors: dict[str, str] = {}
    for (a, name), ans in zip(pairs, answers):
        if ans.ok:
            got.setdefault(a, {})[name] = ans.value
        elif getattr(ans.error, "status", None) == 400:  # INVALID_OPTION: this nsqd has no such option
            got.setdefault(a, {})[name] = None
        else:
            errors.setdefault(a, str(ans.error))
    with _lock:
        for a in addresses:
            lim = _known.setdefault(a, Limits(a))
            lim.http_address = http.get(a)
            values = got.get(a, {})
            if http.get(a) is None:
                lim.error = "its HTTP address is not known (nsqlookupd did not say it, and TCP port + 1 is not it)"
            elif a in errors or len(values) < len(OPTIONS):
                lim.error = errors.get(a, "no answer in time")
            if a in got and "max_msg_size" in values and values["max_msg_size"] is not None:
                lim.source = "config"
                lim.error = None
            for name, value in values.items():
                if value is not None:
                    setattr(lim, name, value)


def _config(http_address: str, name: str, end: float):
    """One /config/<name> answer: an int (a size), or seconds (a duration: ns in JSON)."""
    from ..errors import LookupdError
    from .http import http_json

    left = end - time.monotonic()
    if left <= 0:
        raise LookupdError("no time left", http_address)
    value = http_json(http_address, f"/config/{name}", timeout=left)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LookupdError(f"/config/{name} answered {str(value)[:40]!r}, not a number", http_address)
    return value / 1e9 if name in _DURATIONS else int(value)


def http_address_of(address: str, deadline: float) -> str | None:
    """nsqd ``address``'s (TCP) HTTP address, confirmed: the one nsqlookupd told
    (:func:`note_http`), else TCP port + 1 only when its ``/info`` names ``address``'s TCP port
    (blocking, until ``deadline``, time.monotonic(); at most 1 s). None: not confirmed - nothing
    answered there, or another server did (another nsqd, or a port forward that changes the
    port), or no answer in time. Remembered for the process like :func:`ask`'s."""
    return _http_address(address, deadline)


def _http_address(address: str, end: float) -> str | None:
    """nsqd ``address``'s HTTP address: the one nsqlookupd told, else TCP port + 1 when its
    /info names ``address``'s TCP port (nsqd's default layout: 4150/4151). None: not found."""
    with _lock:
        if address in _http:
            return _http[address]
    from ..errors import NSQError
    from .http import http_json
    from .transport import split_address

    found = None
    try:
        host, port = split_address(address)
        guess = (f"[{host}]" if ":" in host else host) + f":{port + 1}"
        left = end - time.monotonic()
        if left > 0 and port < 65535:
            info = http_json(guess, "/info", timeout=min(left, 1.0))
            if isinstance(info, dict) and info.get("tcp_port") == port:
                found = guess
    except (NSQError, ValueError, OSError) as e:
        if "no complete answer" in str(e):  # slow, not absent: look again next time
            return None
        found = None
    with _lock:
        _http.setdefault(address, found)
        return _http[address]


def forget() -> None:
    """Drop everything known (tests)."""
    with _lock:
        _known.clear()
        _http.clear()
        _refused.clear()
