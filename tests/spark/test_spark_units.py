"""The parts of nsqcli.spark that need no JVM: option parsing, Arrow framing (byte-exact against
the protocol encoder), and the producer's framed publishing with retries on a real nsqd."""

from __future__ import annotations

import threading
import time

import pytest

from helpers import topic_stats

pytestmark = pytest.mark.spark
import pyarrow as pa  # noqa: E402  (a missing extra fails collection: never a skip)


def test_framed_payload_roundtrip_and_errors():
    from nsqcli.errors import LocalProtocolError
    from nsqcli.protocol import encode_mpub, encode_mpub_framed, split_framed
    from nsqcli.protocol.commands import mpub_body

    bodies = [b"a", b"\x00\xff" * 100, b"xyz"]
    framed = mpub_body(bodies)[4:]
    assert encode_mpub_framed("t", 3, framed) == encode_mpub("t", bodies)
    assert split_framed(framed) == bodies
    with pytest.raises(LocalProtocolError):
        split_framed(framed[:-1])
    with pytest.raises(LocalProtocolError):
        encode_mpub_framed("t", 0, b"")


def test_arrow_framer_matches_the_protocol_encoder_byte_for_byte():
    from nsqcli.protocol import encode_dpub, encode_mpub
    from nsqcli.spark.arrow import Framer

    bodies = [bytes([i % 256]) * (1 + i % 37) for i in range(1000)]
    rb = pa.record_batch([pa.array(bodies, pa.binary())], names=["body"])
    frames = list(Framer("t", 128, 5 << 20, 1 << 20).frames([rb.slice(7)]))
    expect = [encode_mpub("t", bodies[7:][i:i + 128]) for i in range(0, 993, 128)]
    assert [f.command() for f in frames] == expect
    # strings, per-row topics (null -> the option's topic), defer_ms -> DPUB
    rb = pa.record_batch([pa.array(["a", "b", "c", "d"]), pa.array(["t1", None, "t2", "t1"]),
                          pa.array([0, None, 5, 100], pa.int64())], names=["body", "topic", "defer_ms"])
    got = sorted(f.command() for f in Framer("dflt", 100, 5 << 20, 1 << 20).frames([rb]))
    assert got == sorted([encode_dpub("t1", 100, b"d"), encode_mpub("t1", [b"a"]), encode_mpub("dflt", [b"b"]),
                          encode_dpub("t2", 5, b"c")])


def test_arrow_framer_respects_max_body_size():
    from nsqcli.spark.arrow import Framer

    rb = pa.record_batch([pa.array([b"x" * 10] * 10)], names=["body"])
    frames = list(Framer("t", 1000, 4 + 14 * 3, 100).frames([rb]))
    assert [f.count for f in frames] == [3, 3, 3, 1]
    assert all(len(f.command()) - len(b"MPUB t\n") - 4 <= 4 + 14 * 3 for f in frames)


@pytest.mark.parametrize("bodies, message", [
    ([b"ok", None], "row 2 of this partition has a null body"),
    ([b"ok", b"ok", b""], "row 3 of this partition has an empty body"),
    ([b"x" * 101], "row 1 of this partition is 101 bytes, over the 100-byte max message size"),
])
def test_arrow_framer_names_the_bad_row(bodies, message):
    from nsqcli.spark.arrow import Framer, RowError

    rb = pa.record_batch([pa.array(bodies, pa.binary())], names=["body"])
    with pytest.raises(RowError, match=message):
        list(Framer("t", 10, 5 << 20, 100).frames([rb]))


def test_arrow_framer_rejects_a_bad_row_topic():
    from nsqcli.spark.arrow import Framer, RowError

    rb = pa.record_batch([pa.array([b"a", b"b"]), pa.array(["ok", "not ok!"])], names=["body", "topic"])
    with pytest.raises(RowError, match="column 'topic'"):
        list(Framer(None, 10, 5 << 20, 100).frames([rb]))


def test_options_parse_and_fail_with_the_option_name():
    from nsqcli.spark import options as opt

    o = {"nsqdTCPAddresses": "127.0.0.1:4150, 127.0.0.1:4250", "lookupdhttpaddresses": "http://h:4161/",
         "tls": "true", "msgTimeout": "5s", "snappy": "yes"}
    assert opt.endpoints(o) == (["127.0.0.1:4150", "127.0.0.1:4250"], ["h:4161"])
    cfg = opt.config(o)
    assert cfg.tls.enabled and cfg.snappy and cfg.msg_timeout == 5.0
    assert opt.seconds({"t": "250"}, "t") == 0.25 and opt.seconds({"t": "2m"}, "t") == 120.0
    for bad, text in [({"nsqdTCPAddresses": "nohost"}, "'nsqdTCPAddresses': 'nohost' is not HOST:PORT"),
                      ({}, "give option 'nsqdTCPAddresses' or 'lookupdHTTPAddresses'")]:
        with pytest.raises(opt.OptionError, match=text):
            opt.endpoints(bad)
    with pytest.raises(opt.OptionError, match="'snappy' and 'deflate'"):
        opt.config({"snappy": "true", "deflate": "true"})
    with pytest.raises(opt.OptionError, match="option 'tls' must be true or false"):
        opt.config({"tls": "maybe"})
    with pytest.raises(opt.OptionError, match="option 'msgTimeout' must be a duration"):
        opt.config({"msgTimeout": "soon"})


def test_publish_framed_retries_until_nsqd_comes_up(nsqd_factory, tmp_path, topic):
    """Every address down: publish_framed waits and goes round again (retries), and the count is
    exact once nsqd answers."""
    from nsqcli.client.producer import Framed, Producer
    from nsqcli.protocol.commands import mpub_body
    from nsqcli.sandbox import free_port

    port = free_port()
    frames = [Framed(topic, mpub_body([b"m%d" % (i * 10 + k) for k in range(10)])[4:], 10) for i in range(5)]
    out: list = []

    def publish():  # nsqd starts from the main thread: a child started by a thread that ends
        try:        # would die with it (the sandbox's PR_SET_PDEATHSIG)
            out.append(Producer(f"127.0.0.1:{port}").publish_framed(iter(frames), retries=6, retry_backoff=0.3))
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=publish)
    t.start()
    time.sleep(1.5)
    server = nsqd_factory(extra_args=[f"--tcp-address=127.0.0.1:{port}"])
    t.join(60)
    result = out[0]
    assert not isinstance(result, Exception), result
    assert result.published == 50 and result.retries >= 1
    assert topic_stats(server, topic)["message_count"] == 50


def test_publish_rows_reports_the_ledger_and_skips_after_a_failure(nsqd, topic):
    """replay's task (under mapInArrow): one ledger row per task, never an exception; once a task
    of a run failed, the run's next tasks in that worker publish nothing."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from nsqcli.sandbox import free_port
    from nsqcli.spark.sink import SinkSettings, publish_rows

    schema = StructType([StructField("body", BinaryType())])
    rb = pa.record_batch([pa.array([b"m%d" % i for i in range(50)], pa.binary())], names=["body"])

    def run(address, run_id, batches):
        settings = SinkSettings({"nsqdTCPAddresses": address, "topic": topic, "maxRetries": "0"}, schema)
        (out,) = list(publish_rows(settings, run_id, batches))
        return out.to_pylist()[0]

    ok = run(nsqd.tcp_address, "run-1", [rb, rb])
    assert (ok["messages"], ok["error"], ok["nsqd"]) == (100, None, [nsqd.tcp_address])
    assert topic_stats(nsqd, topic)["message_count"] == 100
    dead = f"127.0.0.1:{free_port()}"
    left = iter([rb, rb, rb])
    failed = run(dead, "run-2", left)
    assert failed["messages"] == 0 and "Connection refused" in failed["error"]
    assert next(left, None) is None  # the input was drained (Spark reuses the worker only then)
    skipped = run(nsqd.tcp_address, "run-2", [rb])
    assert skipped["messages"] == 0 and skipped["error"].startswith("skipped: not published after an earlier")
    assert run(nsqd.tcp_address, "run-3", [rb])["messages"] == 50  # another run is not affected
    assert topic_stats(nsqd, topic)["message_count"] == 150
