"""Defaults that the click options and `pub`'s click-free fast path (nsqcli.entry) both use,
written once (stdlib only: the fast path must not import click to learn them)."""

from __future__ import annotations

#: the nsqd when neither --nsqd-tcp-address nor --lookupd-http-address is given
NSQD_TCP_ADDRESS = "127.0.0.1:4150"

#: `nsqcli pub --timeout`'s default
PUB_TIMEOUT = "10s"
