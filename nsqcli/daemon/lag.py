"""Channel depth (lag) as nsqd sees it, for the snapshot's ``depth`` rows.

``Lag().poll([(topic, channel, nsqd_tcp_address), ...], timeout)`` asks every nsqd's
``/stats?format=json`` at once (one request per nsqd: filtered to the topic - and channel - when
it carries one, ``include_clients=false``, ``include_mem=false``) and returns one row per target
nsqd answered for: ``{topic, channel, nsqd, depth, in_flight, deferred, seen_at}`` (``nsqd`` the
TCP address as given, ``seen_at`` epoch seconds). A node that does not answer gives no row, and
why is in :attr:`Lag.errors` (nsqd TCP address -> one line) until the next poll; a channel nsqd
does not have (yet) gives no row and no error. Never raises for a node; the whole poll takes at
most ``timeout`` seconds.

Each nsqd's HTTP address is found once (nsqcli.client.limits.http_address_of: the one nsqlookupd
told, else TCP port + 1 when its /info names that TCP port) and kept. One that could not be found
is looked for again at most every :data:`RETRY` seconds (``Lag(retry=...)``): an nsqd down when
the daemon started is found once it is back (limits keeps its "not found" for the process).

Blocking: call it from the harness's own thread, never from the I/O loop.
"""

from __future__ import annotations

import time

#: seconds between two looks for an nsqd HTTP address that could not be found
RETRY = 30.0
#: how much of the poll's time the round's own bookkeeping keeps (fanout's slack)
_SLACK = 0.05


class Lag:
    """Polls channel depth; keeps each nsqd's HTTP address between polls."""

    def __init__(self, retry: float = RETRY):
        self.retry = retry                     # seconds between two looks for an HTTP address not found
        self._http: dict[str, str] = {}        # nsqd tcp address -> its confirmed http address
        self._missed: dict[str, float] = {}    # nsqd tcp address -> when it was last looked for in vain
        self.errors: dict[str, str] = {}       # nsqd tcp address -> why the last poll has no row

    def poll(self, targets, timeout: float) -> list[dict]:
        """Rows for the (topic, channel, nsqd) ``targets`` nsqd answered for, in their order."""
        from ..client.fanout import ask_all
        from ..errors import NSQError

        end = time.monotonic() + max(0.0, timeout)
        targets = [(str(t), str(c), str(n)) for t, c, n in targets]
        self.errors = {}
        nsqds = list(dict.fromkeys(n for _, _, n in targets))
        now = time.monotonic()
        unknown = [n for n in nsqds if n not in self._http
                   and (n not in self._missed or now - self._missed[n] >= self.retry)]
        if unknown:
            left = end - time.monotonic() - _SLACK
            again = {n for n in unknown if n in self._missed}
            found = ask_all(unknown, lambda n: self._find_http(n, end, n in again), max(0.0, left), slack=_SLACK,
                            catch=(NSQError, OSError, ValueError))
            for n, a in zip(unknown, found):
                if a.ok and a.value:
                    self._http[n] = a.value
                    self._missed.pop(n, None)
                else:
                    self._missed[n] = time.monotonic()
                    self.errors[n] = (f"{n}: its HTTP address is not known (nsqlookupd did not say it, and TCP "
                                      f"port + 1 is not it{': ' + str(a.error) if a.error is not None else ''})")
        for n in nsqds:
            if n not in self._http and n not in self.errors:
                self.errors[n] = f"{n}: its HTTP address is not known (looked for again within {self.retry:g}s)"

        asked = [n for n in nsqds if n in self._http]
        wanted = {n: [(t, c) for t, c, m in targets if m == n] for n in asked}
        left = end - time.monotonic() - _SLACK
        if not asked or left <= 0:
            for n in asked:
                self.errors[n] = f"{n}: no time left to ask /stats"
            return []
        answers = ask_all(asked, lambda n: self._stats(n, wanted[n], end), left, slack=_SLACK,
                          catch=(NSQError, OSError, ValueError))
        seen: dict[tuple, dict] = {}
        for n, a in zip(asked, answers):
            if not a.ok:
                self.errors[n] = f"{n}: {a.error}"
                self._http.pop(n, None)  # asked of limits again next time: nsqlookupd may know better
                continue
            stats, at = a.value
            try:
                seen.update(_rows(stats, n, set(wanted[n]), at))
            except (AttributeError, TypeError):
                self.errors[n] = f"{n}: /stats answered {str(stats)[:60]!r}, not nsqd's JSON stats"
        return [seen[t] for t in targets if t in seen]

    def _find_http(self, nsqd: str, end: float, again: bool) -> str | None:
        """limits' answer; when that is "not found" from an earlier look, one look of our own."""
        from ..client import limits

        found = limits.http_address_of(nsqd, end)
        if found is None and again:
            found = _confirm_http(nsqd, end)
            if found is not None:
                limits.note_http(nsqd, found)
        return found

    def _stats(self, nsqd: str, wanted: list[tuple[str, str]], end: float):
        """(nsqd's /stats, when it answered): one request for every target on this nsqd."""
        from ..client.http import http_json

        params = {"format": "json", "include_clients": "false", "include_mem": "false"}
        topics = {t for t, _ in wanted}
        if len(topics) == 1:
            params["topic"] = next(iter(topics))
            channels = {c for _, c in wanted}
            if len(channels) == 1:
                params["channel"] = next(iter(channels))
        left = end - time.monotonic() - _SLACK
        if left <= 0:
            raise ValueError("no time left to ask /stats")
        return http_json(self._http[nsqd], "/stats", params, timeout=left), time.time()


def _confirm_http(nsqd: str, end: float) -> str | None:
    """TCP port + 1 when its /info names ``nsqd``'s TCP port (limits remembers a "not found"
    for the process; this looks again, for an nsqd that was down at the first look)."""
    from ..client.http import http_json
    from ..client.transport import split_address

    host, port = split_address(nsqd)
    left = end - time.monotonic() - _SLACK
    if left <= 0 or port >= 65535:
        return None
    guess = (f"[{host}]" if ":" in host else host) + f":{port + 1}"
    info = http_json(guess, "/info", timeout=min(left, 1.0))
    return guess if isinstance(info, dict) and info.get("tcp_port") == port else None


def _rows(stats: dict, nsqd: str, want: set, at: float) -> dict:
    """{(topic, channel, nsqd): row} for the wanted channels in one nsqd's /stats (v1.0-1.3:
    topics[].channels[] with depth, in_flight_count, deferred_count)."""
    rows = {}
    for topic in stats.get("topics") or []:
        for ch in topic.get("channels") or []:
            key = (topic.get("topic_name"), ch.get("channel_name"))
            if key in want:
                rows[key + (nsqd,)] = {"topic": key[0], "channel": key[1], "nsqd": nsqd,
                                       "depth": _int(ch.get("depth")), "in_flight": _int(ch.get("in_flight_count")),
                                       "deferred": _int(ch.get("deferred_count")), "seen_at": at}
    return rows


def _int(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
