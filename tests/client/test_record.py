"""client.record.Record behaves like the dataclasses it replaced on the `nsqcli pub` path."""

import dataclasses

import pytest

from nsqcli.client.config import Config, TLSConfig
from nsqcli.client.links import ConnStats
from nsqcli.client.record import FrozenInstanceError, Record, field


@dataclasses.dataclass(frozen=True)
class DC:
    a: int
    b: str = "x"
    c: tuple = dataclasses.field(default_factory=tuple)
    d: object = dataclasses.field(default=None, compare=False, repr=False)


class R(Record, frozen=True):
    a: int
    b: str = "x"
    c: tuple = field(default_factory=tuple)
    d: object = field(default=None, compare=False, repr=False)


def test_same_behaviour_as_a_dataclass():
    for args, kw in (((1,), {}), ((1, "y"), {}), ((), {"a": 2, "c": (1,)}), ((3,), {"d": print})):
        dc, r = DC(*args, **kw), R(*args, **kw)
        assert repr(r).split("(", 1)[1] == repr(dc).split("(", 1)[1]
        assert (r == R(*args, **kw)) and hash(r) == hash(R(*args, **kw))
    assert R(1, d=1) == R(1, d=2) and R(1) != R(2)
    assert R(1).replace(b="z") == R(1, "z")
    for bad in (lambda: R(), lambda: R(1, nope=2), lambda: R(1, a=1), lambda: R(1, "b", (), None, 5)):
        with pytest.raises(TypeError):
            bad()
    with pytest.raises(FrozenInstanceError):
        R(1).a = 2
    assert issubclass(FrozenInstanceError, AttributeError)


def test_mutable_records_are_not_hashable_and_can_change():
    s = ConnStats("127.0.0.1:4150", "connected")
    s.rdy = 3
    assert s.rdy == 3 and s != ConnStats("127.0.0.1:4150", "connected")
    assert s.features is not ConnStats("x:1", "init").features  # default_factory: one dict each
    with pytest.raises(TypeError):
        hash(s)


def test_config_defaults_and_with():
    cfg = Config()
    assert cfg == Config() and cfg.tls == TLSConfig() and cfg.deflate_level == 6
    assert cfg.replace(snappy=True).snappy and not cfg.snappy
    assert Config(on_notice=print) == cfg  # on_notice is not compared
    assert "on_notice" not in repr(cfg)
