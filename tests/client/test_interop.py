"""Interop with the official Go tools built by scripts/install-nsq."""

from __future__ import annotations

import subprocess

import pytest
from tests.support.helpers import Collector
from tests.support.helpers import run_nsqcli as run

from nsqcli import Config, Consumer, Producer
from nsqcli.sandbox import find_binary


def test_go_to_nsq_published_messages_consumed_intact(nsqd, topic):
    lines = [b"alpha", b"beta \xe2\x9c\x93", b"gamma\tdelta", b"x" * 5000]
    subprocess.run([find_binary("to_nsq"), f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}"],
                   input=b"\n".join(lines) + b"\n", check=True, capture_output=True, timeout=30)
    col = Collector(len(lines))
    c = Consumer(topic, "c", col, nsqd_tcp_addresses=[nsqd.tcp_address], config=Config(max_in_flight=10))
    c.start()
    try:
        assert col.done.wait(10)
    finally:
        c.stop()
    assert col.bodies == lines


def test_nsqcli_published_messages_read_by_go_nsq_tail(nsqd, topic):
    bodies = [b"one", b"two \xe2\x9c\x93", b"three"]
    with Producer(nsqd.tcp_address, Config(snappy=True)) as p:
        p.multi_publish(topic, bodies)
        p.publish(topic, b"four", defer=0.2)
    out = subprocess.run([find_binary("nsq_tail"), f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}",
                          "-n", "4"], capture_output=True, timeout=30)
    assert out.stdout == b"one\ntwo \xe2\x9c\x93\nthree\nfour\n"


@pytest.fixture
def env(sandbox):
    return {"NSQCLI_NSQD_TCP_ADDRESS": sandbox.nsqd.tcp_address}


def test_cli_interop_with_go_tools(nsqd, env, topic):
    from nsqcli.sandbox import find_binary

    # nsqcli pub/mpub -> Go nsq_tail
    run(["mpub", "-t", topic], env, input=b"from\nnsqcli")
    out = subprocess.run([find_binary("nsq_tail"), f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}",
                          "-n", "2"], capture_output=True, timeout=30)
    assert out.stdout == b"from\nnsqcli\n"
    # Go to_nsq -> nsqcli tail
    t2 = topic + "_go"
    subprocess.run([find_binary("to_nsq"), f"--topic={t2}", f"--nsqd-tcp-address={nsqd.tcp_address}"],
                   input=b"from\nto_nsq\n", check=True, capture_output=True, timeout=30)
    r = run(["tail", "-t", t2, "-n", "2"], env)
    assert r.stdout == b"from\nto_nsq\n"
