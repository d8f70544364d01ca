"""nsqcli.daemon.outages: what the log says while a source is down, and only when it is back.
Unit tests with an injected clock and stand-in consumers; the real nsqd kill is in
tests/cli/test_to_file.py (test_an_nsqd_killed_and_restarted_is_recovered_only_once_back)."""

import json
import logging
import re

from nsqcli.daemon.logs import setup
from nsqcli.daemon.outages import Outages, duration, source_error, sources_recovered
from nsqcli.errors import ConnectError, LookupdError, TransportError


class Stat:
    def __init__(self, address, connected_at):
        self.address, self.connected_at = address, connected_at


class Discovery:
    def __init__(self, listed=None):
        self.listed = listed
        self.answered = {}


class FakeConsumer:
    """What Outages reads of a Consumer: topic, connections, stats(), nsqd/lookupd addresses,
    discovery.listed / .answered."""

    def __init__(self, topic, nsqd=(), lookupd=(), listed=None):
        self.topic = topic
        self.nsqd_addresses = list(nsqd)
        self.lookupd_addresses = list(lookupd)
        self.discovery = Discovery(listed)
        self.up: dict[str, float] = {}  # address -> connected_at (wall)
        self._stopping = False

    @property
    def connections(self):
        return list(self.up)

    def stats(self):
        return [Stat(a, t) for a, t in self.up.items()]


class Clock:
    def __init__(self):
        self.mono, self.wall = 1000.0, 1_764_236_400.0

    def advance(self, s):
        self.mono += s
        self.wall += s


class Said:
    """An app whose warn/info lines are collected (no logger: the plain path)."""

    def __init__(self):
        self.lines = []
        self.logger = None

    def warn(self, text):
        self.lines.append("warning: " + text)

    def info(self, text):
        self.lines.append(text)


def make(watch=False, **kw):
    clock, app = Clock(), Said()
    o = Outages(app, clock=lambda: clock.mono, wall=lambda: clock.wall, watch=watch, **kw)
    return o, clock, app


A, B = "127.0.0.1:4150", "127.0.0.1:4250"


def test_a_lookupd_found_nsqd_is_not_recovered_while_another_nsqd_is_connected():
    """The bug of issue 35: any other connection used to count as the lost node's recovery."""
    o, clock, app = make()
    c = FakeConsumer("t", lookupd=["127.0.0.1:4161"], listed={A, B})
    c.up = {A: clock.wall - 60, B: clock.wall - 60}
    sources_recovered(o, [c])
    del c.up[A]
    source_error(o, TransportError("connection closed by nsqd", A))
    for _ in range(20):
        clock.advance(1)
        sources_recovered(o, [c])
    assert not any("recovered" in ln for ln in app.lines), app.lines
    c.up[A] = clock.wall  # back, but not yet for STABLE_AFTER
    sources_recovered(o, [c])
    assert not any("recovered" in ln for ln in app.lines)
    clock.advance(1.5)
    sources_recovered(o, [c])
    rec = [ln for ln in app.lines if ln.startswith("recovered:")]
    assert len(rec) == 1 and rec[0].startswith(f"recovered: source {A}: connected again (1 failure since ")
    assert rec[0].endswith(", down 20s)"), rec  # until it connected again


def test_reminders_while_down_even_without_new_failures_at_a_growing_interval():
    o, clock, app = make(every=30.0, remind_max=120.0)
    c = FakeConsumer("t", nsqd=[A])
    source_error(o, ConnectError("connection refused", A))
    assert app.lines == [f"warning: source: {A}: connection refused"]
    said_at = []
    for s in range(1, 400):
        clock.advance(1)
        before = len(app.lines)
        sources_recovered(o, [c])
        if len(app.lines) > before:
            said_at.append(s)
    assert said_at == [30, 90, 210, 330], said_at  # 30, 60, 120, 120 (the cap) apart
    reminder = app.lines[1]
    assert re.fullmatch(rf"warning: source {A} still down after 30s \(1 failure since \d\d:\d\d:\d\dZ; "
                        rf"last: {A}: connection refused\)", reminder), reminder
    assert "still down after 5m30s" in app.lines[-1]


def test_repeated_failures_are_counted_and_said_with_the_count_when_due_or_changed():
    o, clock, app = make(every=30.0)
    for _ in range(9):
        source_error(o, ConnectError("connection refused", A))
        clock.advance(1)
    assert len(app.lines) == 1
    clock.advance(30)
    source_error(o, ConnectError("connection refused", A))  # due: said with its count
    source_error(o, ConnectError("timed out", A))  # changed: said at once
    assert app.lines[1].startswith(f"warning: source: {A}: connection refused (x10 since ")
    assert app.lines[2].startswith(f"warning: source: {A}: timed out (x11 since ")
    assert o.counts() == {"source": 11}


def test_an_nsqd_nsqlookupd_no_longer_lists_ends_with_its_own_line_not_recovered():
    o, clock, app = make(forget_after=60.0)
    c = FakeConsumer("t", lookupd=["127.0.0.1:4161"], listed={A, B})
    c.up = {B: clock.wall - 10}
    source_error(o, TransportError("connection closed by nsqd", A))
    clock.advance(5)
    c.discovery.listed = {B}  # the lookupds answered without it
    for _ in range(70):
        clock.advance(1)
        sources_recovered(o, [c])
    ends = [ln for ln in app.lines if "no longer listed" in ln]
    assert len(ends) == 1 and ends[0].startswith(f"source {A}: no longer listed by nsqlookupd for 1m00s")
    assert not any("recovered" in ln for ln in app.lines) and o.failing() == []
    assert any("nsqlookupd has not listed it for" in ln for ln in app.lines)  # said in the reminder


def test_a_listed_or_named_nsqd_is_waited_for():
    o, clock, app = make(forget_after=10.0)
    named = FakeConsumer("t", nsqd=[A], lookupd=["127.0.0.1:4161"], listed=set())
    unknown = FakeConsumer("u", lookupd=["127.0.0.1:4161"], listed=None)  # no full answer yet
    for consumers in ([named], [unknown]):
        source_error(o, ConnectError("connection refused", A))
        for _ in range(30):
            clock.advance(1)
            sources_recovered(o, consumers)
        assert o.failing() == [("source", A)], (consumers, app.lines)
        o.ok(("source", A))


def test_a_lookupd_recovers_when_it_answers_again_and_says_so():
    o, clock, app = make()
    c = FakeConsumer("t", lookupd=["127.0.0.1:4161"], listed=set())
    c.up = {A: clock.wall - 100}
    source_error(o, LookupdError("connection refused", "http://127.0.0.1:4161"))
    clock.advance(5)
    sources_recovered(o, [c])
    assert o.failing() == [("source", "http://127.0.0.1:4161")]  # a connection to an nsqd is not its recovery
    c.discovery.answered["http://127.0.0.1:4161"] = clock.wall
    clock.advance(0.1)
    sources_recovered(o, [c])
    assert o.failing() == [] and app.lines[-1].startswith(
        "recovered: nsqlookupd http://127.0.0.1:4161: it answers again (1 failure since ")
    assert o.counts() == {"lookupd": 1}


def test_an_error_without_an_address_recovers_at_any_connection_and_says_which():
    o, clock, app = make()
    c = FakeConsumer("t", nsqd=[A])
    o.failed(("source", None), "source: something failed")
    sources_recovered(o, [c])
    assert o.failing()
    c.up = {A: clock.wall - 5}
    sources_recovered(o, [c])
    assert app.lines[-1].startswith(f"recovered: source: a connection to {A} is up (the failing address is not "
                                    "known) (1 failure since ")


def test_connection_changes_are_said_once_per_nsqd_not_per_topic():
    o, clock, app = make(watch=True)
    consumers = [FakeConsumer(f"t{i}", nsqd=[A, B]) for i in range(200)]
    for c in consumers:
        c.up = {A: clock.wall, B: clock.wall}
    sources_recovered(o, consumers)
    assert sorted(app.lines) == [f"nsqd {A} connected (200 topics)", f"nsqd {B} connected (200 topics)"]
    app.lines.clear()
    for c in consumers:  # B killed: every topic loses it
        del c.up[B]
    sources_recovered(o, consumers)
    assert app.lines == [f"warning: nsqd {B}: connection lost (200 topics)"]
    app.lines.clear()
    clock.advance(133)
    for c in consumers:
        c.up[B] = clock.wall
    sources_recovered(o, consumers)
    assert app.lines == [f"source {B}: connected again after 2m13s down (200 topics)"]
    app.lines.clear()
    del consumers[0].up[A]  # one topic's connection only
    sources_recovered(o, consumers)
    assert app.lines == [f"warning: nsqd {A}: connection lost (topic t0; 199 topics still connected)"]
    app.lines.clear()
    removed = consumers.pop()  # a topic unsubscribed (its consumer gone): not a lost connection
    sources_recovered(o, consumers)
    assert app.lines == []
    del removed


def test_with_an_outage_open_the_loss_is_info_and_the_return_is_the_recovered_line():
    o, clock, app = make(watch=True)
    c = FakeConsumer("t", nsqd=[A])
    c.up = {A: clock.wall}
    sources_recovered(o, [c])
    del c.up[A]
    source_error(o, TransportError("connection closed by nsqd", A))
    sources_recovered(o, [c])
    assert app.lines[1:] == [f"warning: source: {A}: connection closed by nsqd",
                             f"nsqd {A}: connection lost (topic t)"]
    clock.advance(4)
    c.up[A] = clock.wall
    sources_recovered(o, [c])
    assert len(app.lines) == 3  # not yet: a flapping node is not "back"
    clock.advance(1)
    sources_recovered(o, [c])
    assert app.lines[3].startswith(f"recovered: source {A}: connected again (1 failure since ")


def test_json_log_lines_carry_the_event_and_fields():
    lines = []
    logger = setup("to-file", "info", "json", write=lines.append)
    try:
        clock = Clock()
        o = Outages(logger, clock=lambda: clock.mono, wall=lambda: clock.wall, every=30.0)
        source_error(o, ConnectError("connection refused", A))
        clock.advance(30)
        o.tick()
        c = FakeConsumer("t", nsqd=[A])
        c.up = {A: clock.wall - 2}
        sources_recovered(o, [c])  # a logger: watching connections too
        docs = [json.loads(ln) for ln in lines]
        assert [d["event"] for d in docs] == ["source_down", "source_still_down", "connected", "source_recovered"] \
            or [d["event"] for d in docs] == ["source_down", "source_still_down", "source_recovered"], docs
        down = docs[0]
        assert down["level"] == "warning" and down["source"] == A and down["kind"] == "nsqd"
        assert down["error"] == f"source: {A}: connection refused" and down["command"] == "to-file"
        assert docs[1]["failures"] == 1 and docs[1]["down_seconds"] == 30.0
        assert docs[-1]["level"] == "info" and docs[-1]["down_seconds"] == 28.0  # until it connected
    finally:
        logging.getLogger("nsqcli").handlers[:] = []


def test_app_with_a_logger_says_through_it_and_without_keeps_its_lines(capsys):
    from nsqcli.cli.app import App

    app = App()
    app.warn("plain")
    assert capsys.readouterr().err == "nsqcli: warning: plain\n"
    lines = []
    app.logger = setup("to-nsq", "info", write=lines.append)
    try:
        app.warn("disk slow", event="slow", fields={"ms": 3})
        app.info("hello")
        app.debug("hidden at info")
        assert capsys.readouterr().err == ""
        assert len(lines) == 2
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z nsqcli to-nsq\[\d+\] WARNING: disk slow", lines[0])
        assert lines[1].endswith("] INFO: hello")
    finally:
        logging.getLogger("nsqcli").handlers[:] = []


def test_durations():
    assert [duration(s) for s in (4.24, 31, 133, 3600 * 3 + 300, 86400 * 2 + 3600 * 4)] == \
        ["4.2s", "31s", "2m13s", "3h05m", "2d04h"]
