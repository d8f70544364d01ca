"""The parts of nsqcli.spark that need no JVM: option parsing, Arrow framing (byte-exact against
the protocol encoder), and the producer's framed publishing with retries on a real nsqd."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.helpers import topic_stats

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


# -- the option registry: what each side accepts, and what it says about the rest ----------------
@pytest.mark.parametrize("kind, options, message", [
    ("source", {"tpoic": "t"}, "unknown option 'tpoic' (did you mean 'topic'?)"),
    ("source", {"maxmesagesperbatch": "5"},
     "unknown option 'maxmesagesperbatch' (did you mean 'maxMessagesPerBatch'?)"),
    ("sink", {"batchszie": "5"}, "(did you mean 'batchSize'?)"),
    ("source", {"frobnicate": "1"}, "unknown option 'frobnicate' (the source's options: nsqdTCPAddresses, "),
    ("source", {"subscribe": "a,b"},
     "option 'subscribe' is Kafka's: name the topics with option 'topic' (comma-separated)"),
    ("source", {"subscribePattern": "a.*"}, "option 'subscribePattern' is Kafka's: NSQ cannot subscribe by pattern"),
    ("source", {"assign": "{}"}, "option 'assign' is Kafka's: NSQ topics have no partitions to assign"),
    ("source", {"startingoffsets": "earliest"}, "option 'startingOffsets' is Kafka's: NSQ has no offsets; a channel "
     "gets the messages published after it exists; to re-read history, archive with `nsqcli to-file` and use "
     "`nsqcli replay` or nsqcli.spark.read_archive"),
    ("source", {"endingOffsets": "latest"}, "NSQ has no offsets"),
    ("source", {"startingTimestamp": "0"}, "NSQ has no offsets"),
    ("source", {"startingOffsetsByTimestamp": "{}"}, "NSQ has no offsets"),
    ("source", {"kafka.bootstrap.servers": "h:9092"}, "option 'kafka.bootstrap.servers' is Kafka's: give option "
     "'nsqdTCPAddresses'"),
    ("sink", {"kafka.bootstrap.servers": "h:9092"}, "or 'lookupdHTTPAddresses'"),
    ("sink", {"kafka.acks": "all"}, "option 'kafka.acks' is Kafka's: NSQ has no such setting; the nsq sink waits "
     "for nsqd's OK on every message"),
    ("sink", {"kafka.linger.ms": "5"}, "option 'kafka.linger.ms' is Kafka's: NSQ has no such setting (the connection "
     "options: nsqdTCPAddresses"),
    ("source", {"kafka.ssl.truststore.location": "x"}, "give options 'tls', 'tlsCAFile'"),
    ("source", {"kafka.sasl.mechanism": "PLAIN"}, "option 'authSecret' or 'authSecretFile'"),
    ("source", {"kafka.group.id": "g"}, "option 'kafka.group.id' is Kafka's: give option 'channel'"),
    ("source", {"groupidprefix": "g"}, "option 'groupIdPrefix' is Kafka's: give option 'channel'"),
    ("source", {"maxOffsetsPerTrigger": "10"},
     "option 'maxOffsetsPerTrigger' is Kafka's: use option 'maxMessagesPerBatch'"),
    ("source", {"failOnDataLoss": "false"}, "option 'failOnDataLoss' is Kafka's: NSQ has no offsets to lose"),
    ("source", {"includeHeaders": "true"}, "option 'includeHeaders' is Kafka's: NSQ messages have no headers"),
    ("source", {"path": "/x"}, "there is no path in NSQ (load(), save() and start() take none): name the topic "
     "with option 'topic'"),
    ("sink", {"path": "/x"}, "there is no path in NSQ"),
    ("source", {"checkpointlocation": "/ck"}, "option 'checkpointlocation' belongs to writeStream (the query), "
     "not to readStream.format('nsq')"),
    ("source", {"batchSize": "5"}, "option 'batchSize' is for the sink (df.write / df.writeStream .format('nsq')), "
     "not the source"),
    ("sink", {"channel": "c"}, "option 'channel' is for the source (spark.readStream.format('nsq')), not the sink"),
    ("sink", {"maxMessagesPerBatch": "5"}, "option 'maxMessagesPerBatch' is for the source"),
])
def test_option_registry_refuses_with_a_hint(kind, options, message):
    from nsqcli.spark import options as opt

    with pytest.raises(opt.OptionError) as info:
        opt.check_options({"topic": "t", **options}, kind)
    assert str(info.value).startswith("nsq data source: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_option_registry_accepts_every_known_name_in_any_case():
    from nsqcli.spark import options as opt

    for kind, names in (("source", opt.CONNECTION + opt.SOURCE), ("sink", opt.CONNECTION + opt.SINK + opt.SPARK_SINK)):
        opt.check_options({n: "x" for n in names}, kind)
        opt.check_options({n.lower(): "x" for n in names}, kind)  # Spark hands them lowercased
        opt.check_options({n.upper(): "x" for n in names}, kind)
    with pytest.raises(opt.OptionError, match="unknown option 'maxInFlight'"):
        opt.check_options({"maxInFlight": "5"}, "source")


def test_option_registry_names_every_problem_in_one_line():
    from nsqcli.spark import options as opt

    with pytest.raises(opt.OptionError) as info:
        opt.check_options({"subscribe": "t", "startingOffsets": "earliest", "tpoic": "t"}, "source")
    text = str(info.value)
    assert text.count("nsq data source: ") == 1 and "\n" not in text
    assert text.index("'subscribe'") < text.index("'startingOffsets'") < text.index("'tpoic'")


def test_option_error_pickles_without_a_second_prefix():
    import pickle

    from nsqcli.spark.options import OptionError

    e = pickle.loads(pickle.dumps(OptionError("option 'topic' is required")))
    assert str(e) == "nsq data source: option 'topic' is required" and e.detail == "option 'topic' is required"


@pytest.mark.parametrize("fields, ok", [
    ([("body", "binary"), ("id", "string"), ("timestamp", "timestamp"), ("attempts", "int"), ("nsqd", "string"),
      ("topic", "string"), ("channel", "string")], True),
    ([("BODY", "binary"), ("id", "string"), ("timestamp", "timestamp"), ("attempts", "int"), ("nsqd", "string"),
      ("topic", "string"), ("channel", "string")], True),
    ([("body", "string"), ("id", "string"), ("timestamp", "timestamp"), ("attempts", "int"), ("nsqd", "string"),
      ("topic", "string"), ("channel", "string")], False),
    ([("key", "binary"), ("value", "binary")], False),
    ([("body", "binary")], False),
])
def test_source_schema_is_fixed(fields, ok):
    from nsqcli.spark import options as opt

    ddl = "body binary, id string, timestamp timestamp, attempts int, nsqd string, topic string, channel string"
    if ok:
        opt.check_source_schema(fields, ddl)
        return
    with pytest.raises(opt.OptionError) as info:
        opt.check_source_schema(fields, ddl)
    assert str(info.value) == ("nsq data source: the source's columns are fixed: body binary, id string, timestamp "
                               "timestamp, attempts int, nsqd string, topic string, channel string; do not give "
                               ".schema(...) (select or cast the columns after load())")


@pytest.mark.parametrize("fields, message", [
    ({"value": "binary"}, "has no 'body' column (binary or string); columns: value; column 'value' is Kafka's "
     "message: the nsq sink publishes column 'body'; rename it (.withColumnRenamed('value', 'body'))"),
    ({"body": "binary", "key": "binary"}, "column 'key' is Kafka's: NSQ messages have only a body; put it into the "
     "body (e.g. to_json(struct(...)) as body) or drop it"),
    ({"body": "binary", "headers": "array<struct<key:string,value:binary>>"}, "column 'headers' is Kafka's"),
    ({"body": "binary", "partition": "int"}, "column 'partition' is Kafka's"),
    ({"body": "binary", "value": "binary"}, "column 'value' is Kafka's message"),
])
def test_sink_refuses_kafka_columns(fields, message):
    from nsqcli.spark.arrow import check_schema
    from nsqcli.spark.options import OptionError

    with pytest.raises(OptionError) as info:
        check_schema(fields, "t")
    assert message in str(info.value)


def test_sink_accepts_the_source_schema_and_other_extra_columns():
    from nsqcli.spark.arrow import check_schema

    check_schema({"body": "binary", "id": "string", "timestamp": "timestamp", "attempts": "int", "nsqd": "string",
                  "topic": "string", "channel": "string", "offset": "bigint"}, None)


def test_publish_rows_reports_the_ledger_and_skips_after_a_failure(nsqd, topic):
    """replay's task (under mapInArrow): one ledger row per task, never an exception; once a task
    of a run failed, the run's next tasks in that worker publish nothing."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from nsqcli.sandbox import free_port
    from nsqcli.spark.sink import SinkSettings, publish_rows

    schema = StructType([StructField("body", BinaryType())])
    rb = pa.record_batch([pa.array([b"m%d" % i for i in range(50)], pa.binary())], names=["body"])

    def run(address, run_id, batches):
        settings = SinkSettings({"nsqdTCPAddresses": address, "topic": topic, "retryTimeout": "0"}, schema)
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


def test_a_batch_plan_keeps_every_cap_with_targets_of_unknown_depth():
    """maxMessagesPerBatch (to-parquet --max-messages-per-batch) caps the whole batch, also when
    some targets' depth is unknown (nsqdTCPAddresses only: no /stats). It did not: such a target
    asked for a whole maxMessagesPerPartition share, and a first batch took all 3,000 messages
    with a cap of 200."""
    from hypothesis import given, settings, strategies as st

    from nsqcli.spark.plan import Target, plan_batch

    depths_st = st.lists(st.one_of(st.none(), st.integers(0, 5000)), min_size=1, max_size=6)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(depths_st, st.one_of(st.none(), st.integers(1, 4000)), st.integers(1, 2000), st.integers(1, 8))
    def check(depths, cap, per_partition, min_partitions):
        targets = [(Target(f"t{i}", f"127.0.0.1:{4150 + i}", None), d) for i, d in enumerate(depths)]
        parts = plan_batch(targets, cap, per_partition, min_partitions)
        asked = sum(per_partition if d is None else d for _, d in targets)
        assert all(0 < p.share <= per_partition for p in parts)
        if cap is not None:
            assert sum(p.share for p in parts) <= cap
        if cap is None or asked <= cap:  # nothing to share out: each target gets what it asked
            for t, d in targets:
                got = sum(p.share for p in parts if (p.topic, p.tcp) == (t.topic, t.tcp))
                assert got == (per_partition if d is None else d)

    check()
    only_tcp = plan_batch([(Target("t", "127.0.0.1:4150", None), None)], 200, 100000)
    assert sum(p.share for p in only_tcp) == 200
