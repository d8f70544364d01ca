"""to-http's endpoints and what an answer means: the URLs a message goes to (a --post URL as is,
a --get URL with the query-escaped body in its ``%s``), a failed delivery, and the Retry-After an
endpoint may send with it. The delivery itself (connections, modes, the I/O thread) is
nsqcli.relay.http_delivery's."""

from __future__ import annotations

import time
import urllib.parse


class Endpoint:
    """One --post or --get URL, checked: where a message goes and the request target it gets."""

    def __init__(self, method: str, url: str):
        self.method, self.url = method, url
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port  # (urllib checks the port only when asked)
        except ValueError as e:  # "Invalid IPv6 URL", "Port out of range 0-65535": name the URL
            raise ValueError(f"invalid URL {url!r}: {e}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid URL {url!r}: expected http(s)://HOST[:PORT]/PATH")
        if not url.isascii():
            raise ValueError(f"invalid URL {url!r}: percent-encode what is not ASCII")
        if any(c <= " " or c == "\x7f" for c in url):  # it would split the request line
            raise ValueError(f"invalid URL {url!r}: percent-encode spaces and control characters (%20)")
        if method == "GET" and url.count("%s") != 1:
            raise ValueError(f"a --get URL needs exactly one %s (replaced by the query-escaped body): {url!r}")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.host_header = parts.netloc.rpartition("@")[2]
        self.key = (self.scheme, self.host, self.port)
        if method == "POST":
            self.fixed_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def target(self, body: bytes) -> str:
        if self.method == "POST":
            return self.fixed_target
        url = self.url.replace("%s", urllib.parse.quote(body, safe=""))
        parts = urllib.parse.urlsplit(url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class Failed(Exception):
    """``abandoned``: not the endpoint's failure - the deliverer gave the exchange up (abort())."""

    def __init__(self, message: str, retry_after: float | None = None, abandoned: bool = False):
        super().__init__(message)
        self.retry_after, self.abandoned = retry_after, abandoned


#: the longest Retry-After taken as is: nsqd's default --max-req-timeout (a REQ's longest delay)
MAX_RETRY_AFTER = 3600.0


def retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (delta-seconds or an HTTP date) up to MAX_RETRY_AFTER, None
    when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # not str.isdigit() alone: "²" is a digit to it
        return min(float(value), MAX_RETRY_AFTER)
    try:
        from email.utils import parsedate_to_datetime

        return min(max(0.0, parsedate_to_datetime(value).timestamp() - time.time()), MAX_RETRY_AFTER)
    except (TypeError, ValueError, OverflowError):
        return None
