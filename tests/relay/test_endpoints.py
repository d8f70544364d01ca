"""nsqcli.relay.endpoints: the --post/--get URLs to-http accepts, and the Retry-After it reads."""

from __future__ import annotations

import email.utils
import time

import pytest

from nsqcli.relay.endpoints import MAX_RETRY_AFTER, Endpoint, retry_after


@pytest.mark.parametrize("value,seconds", [
    ("7", 7.0), (" 30 ", 30.0), ("0", 0.0), (None, None), ("", None),
    ("\u00b2", None), ("\u0663", None), ("-5", None), ("+5", None), ("1.5", None), ("garbage", None),
    ("9" * 400, MAX_RETRY_AFTER),  # float() of it is inf: a REQ of inf ms raised in req_ms
    ("86400", MAX_RETRY_AFTER),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date gone by: at once
    ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER),
])
def test_retry_after_reads_seconds_and_dates_and_nothing_else(value, seconds):
    assert retry_after(value) == seconds


def test_retry_after_as_a_date_is_the_time_left():
    soon = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 115 <= retry_after(soon) <= 121


@pytest.mark.parametrize("url,why", [
    ("ftp://h/x", "expected http(s)://HOST[:PORT]/PATH"),
    ("http:///p", "expected http(s)://HOST[:PORT]/PATH"),
    ("http://h/\u00e9", "percent-encode what is not ASCII"),
    ("http://h/a b", "percent-encode spaces and control characters"),  # it would split the request line
    ("http://h/a\tb", "percent-encode spaces and control characters"),  # (urlsplit drops tabs)
    ("http://h/a\x7fb", "percent-encode spaces and control characters"),
    ("http://h:99999/", "Port out of range"),
    ("http://h:abc/", "Port could not be cast"),
    ("https://[::1/x", "Invalid IPv6 URL"),
])
def test_a_bad_url_is_refused_naming_it(url, why):
    with pytest.raises(ValueError) as e:
        Endpoint("POST", url)
    assert str(e.value).startswith(f"invalid URL {url!r}: ") and why in str(e.value)


def test_targets_of_post_and_get_urls():
    assert Endpoint("POST", "http://h:8080/p?q=1").target(b"x") == "/p?q=1"
    assert Endpoint("POST", "https://h").port == 443 and Endpoint("POST", "https://h").target(b"") == "/"
    get = Endpoint("GET", "http://u:pw@h/in?m=%s&x=1")
    assert get.target(b"a b/&") == "/in?m=a%20b%2F%26&x=1" and get.host_header == "h"
    with pytest.raises(ValueError, match="exactly one %s"):
        Endpoint("GET", "http://h/in?a=%s&b=%s")
