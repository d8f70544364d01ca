"""What a user of format("nsq") sees for a mistake, on a real SparkSession (pyspark 4.3) and a real
nsqd: one message from us, as early as Spark lets a Python data source speak, and nothing
published or consumed. Where it surfaces is part of the contract:

- readStream...load(): schema() runs, so load() raises (AnalysisException);
- readStream.schema(...): nothing of ours runs at load(); the query fails when it starts;
- df.write...save(): writer() runs before any task, so save() raises;
- writeStream...start(): returns; streamWriter() runs in the query, which fails at once;
- spark.read.format("nsq"): load() works (Spark does not tell batch from stream), the first
  action raises.
"""

from __future__ import annotations

import pytest

from tests.support.helpers import topic_stats

pytestmark = pytest.mark.spark


def refusal(info) -> str:
    """What the user reads: str() of the exception Spark raised."""
    text = str(info.value)
    assert "nsq data source: " in text, text
    assert "UnboundLocalError" not in text, text
    return text


# -- source: refused at load() --------------------------------------------------------------------
@pytest.mark.parametrize("options, path, message", [
    ({}, None, "nsq data source: option 'topic' is required"),
    ({"topic": "{topic}", "channel": "bad channel!"}, None, "option 'channel'"),
    ({"tpoic": "{topic}"}, None, "unknown option 'tpoic' (did you mean 'topic'?)"),
    ({"subscribe": "{topic}"}, None, "option 'subscribe' is Kafka's: name the topics with option 'topic' "
     "(comma-separated)"),
    ({"topic": "{topic}", "startingOffsets": "earliest"}, None, "option 'startingOffsets' is Kafka's: NSQ has no "
     "offsets; a channel gets the messages published after it exists; to re-read history, archive with "
     "`nsqcli to-file` and use `nsqcli replay` or nsqcli.spark.read_archive"),
    ({"topic": "{topic}", "kafka.bootstrap.servers": "h:9092"}, None, "give option 'nsqdTCPAddresses'"),
    ({"topic": "{topic}", "kafka.group.id": "g"}, None, "give option 'channel'"),
    ({"topic": "{topic}", "maxOffsetsPerTrigger": "10"}, None, "use option 'maxMessagesPerBatch'"),
    ({"topic": "{topic}", "batchSize": "10"}, None, "option 'batchSize' is for the sink"),
    ({"topic": "{topic}", "checkpointLocation": "/tmp/ck"}, None, "belongs to writeStream (the query)"),
    ({"topic": "{topic}"}, "/data/events", "there is no path in NSQ"),
    ({"topic": "{topic}"}, None, "option 'spoolLocation' is required: a directory every executor can write"),
    ({"topic": "{topic}", "spoolLocation": "spool"}, None, "option 'spoolLocation' must be an absolute path"),
    ({"topic": "{topic}", "spoolLocation": "s3a://b/spool"}, None, "is not a filesystem path"),
    ({"topic": "{topic}", "channel": "c#ephemeral"}, None, "an #ephemeral channel or topic cannot be read exactly once"),
])
def test_source_mistakes_fail_at_load(spark, nsqd, topic, options, path, message):
    reader = spark.readStream.format("nsq").option("nsqdTCPAddresses", nsqd.tcp_address)
    if "spool" not in message:
        reader = reader.option("spoolLocation", "/tmp/nsq-spool")
    for k, v in options.items():
        reader = reader.option(k, v.format(topic=topic))
    with pytest.raises(Exception) as info:
        reader.load(path) if path else reader.load()
    assert type(info.value).__name__ == "AnalysisException"
    assert message in refusal(info)
    assert topic_stats(nsqd, topic) is None  # nothing subscribed, nothing created


@pytest.mark.parametrize("options, message", [
    ({"topic": "{topic}"}, "nsq data source: the source's columns are fixed: body binary, id string, timestamp "
     "timestamp, attempts int, nsqd string, topic string, channel string; do not give .schema(...)"),
    ({"topic": "{topic}", "subscribe": "x"}, "the source's columns are fixed"),
])
def test_source_user_schema_fails_when_the_query_starts(spark, nsqd, topic, tmp_path, options, message):
    reader = (spark.readStream.format("nsq").schema("key binary, value binary")
              .option("nsqdTCPAddresses", nsqd.tcp_address))
    for k, v in options.items():
        reader = reader.option(k, v.format(topic=topic))
    df = reader.load()  # Spark runs nothing of ours here when a schema is given
    q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(Exception) as info:
        q.awaitTermination(120)
    assert type(info.value).__name__ == "StreamingQueryException"
    assert message in refusal(info)
    assert topic_stats(nsqd, topic) is None


def test_batch_read_is_refused_with_the_streaming_way(spark, nsqd, topic):
    df = (spark.read.format("nsq").option("nsqdTCPAddresses", nsqd.tcp_address).option("topic", topic)
          .option("spoolLocation", "/tmp/nsq-spool").load())
    with pytest.raises(Exception) as info:
        df.collect()
    assert ("nsq data source: spark.read.format('nsq') would consume the channel without a checkpoint; use "
            "spark.readStream.format('nsq') with .trigger(availableNow=True)") in refusal(info)
    assert topic_stats(nsqd, topic) is None


# -- sink: refused at save(), or as soon as a streaming query runs -----------------------------------
@pytest.mark.parametrize("columns, options, mode, path, message", [
    ("cast(id as string) as body", {"kafka.acks": "all"}, "append", None,
     "option 'kafka.acks' is Kafka's: NSQ has no such setting; the nsq sink waits for nsqd's OK on every message"),
    ("cast(id as string) as body", {"kafka.bootstrap.servers": "h:9092"}, "append", None, "'nsqdTCPAddresses'"),
    ("cast(id as string) as body", {"channel": "c"}, "append", None, "option 'channel' is for the source"),
    ("cast(id as string) as body", {"batchSzie": "10"}, "append", None, "(did you mean 'batchSize'?)"),
    ("cast(id as string) as body", {}, "append", "/out", "there is no path in NSQ"),
    ("cast(id as string) as body", {}, "overwrite", None, "nsq data source: mode('overwrite') is not possible: NSQ "
     "only appends (published messages cannot be taken back); use mode('append')"),
    ("cast(cast(id as string) as binary) as key, cast(id as string) as value", {}, "append", None,
     "column 'value' is Kafka's message: the nsq sink publishes column 'body'; rename it"),
    ("cast(id as string) as body, cast(cast(id as string) as binary) as key", {}, "append", None,
     "column 'key' is Kafka's: NSQ messages have only a body; put it into the body"),
])
def test_sink_mistakes_fail_at_save(spark, nsqd, topic, columns, options, mode, path, message):
    df = spark.range(3).selectExpr(*columns.split(", "))
    w = df.write.format("nsq").options(nsqdTCPAddresses=nsqd.tcp_address, topic=topic, **options).mode(mode)
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(Exception) as info:
        w.save(path) if path else w.save()
    assert type(info.value).__name__ == "AnalysisException"
    assert message in refusal(info)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before  # no task ran
    assert topic_stats(nsqd, topic) is None  # nothing published


def test_sink_default_mode_is_refused_by_spark_itself(spark, nsqd, topic):
    """mode("errorifexists") (the default) and mode("ignore") never reach us: Spark refuses them for
    every Python data source, and its message suggests Overwrite, which we refuse in turn."""
    df = spark.range(3).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception) as info:
        df.write.format("nsq").options(nsqdTCPAddresses=nsqd.tcp_address, topic=topic).save()
    assert "UNSUPPORTED_DATA_SOURCE_SAVE_MODE" in str(info.value)
    assert topic_stats(nsqd, topic) is None


def test_sink_keeps_accepting_the_source_columns(spark, nsqd, topic):
    """A DataFrame shaped like the nsq source's (id, timestamp, ... beside body and topic) is
    published: only Kafka's column names are refused."""
    df = spark.range(3).selectExpr("cast(cast(id as string) as binary) as body", "cast(id as string) as id",
                                   "current_timestamp() as timestamp", "1 as attempts", "'n:1' as nsqd",
                                   f"'{topic}' as topic", "'c' as channel")
    df.write.format("nsq").option("nsqdTCPAddresses", nsqd.tcp_address).mode("append").save()
    assert topic_stats(nsqd, topic)["message_count"] == 3


@pytest.mark.parametrize("mode, columns, options, message", [
    ("complete", "agg", {}, "nsq data source: outputMode('complete') would publish the whole result table again "
     "on every trigger: NSQ only appends; use outputMode('append')"),
    ("update", "agg", {}, "nsq does not support Update mode"),  # Spark's own, before any call to us
    ("append", "value as body", {"kafka.acks": "all"}, "option 'kafka.acks' is Kafka's"),
    ("append", "value as body, value as key", {}, "column 'key' is Kafka's"),
])
def test_stream_sink_mistakes_fail_the_query_at_once(spark, nsqd, topic, tmp_path, mode, columns, options, message):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("x\ny\n")
    df = spark.readStream.format("text").load(str(src))
    if columns == "agg":
        df = df.groupBy("value").count().selectExpr("value as body")
    else:
        df = df.selectExpr(*columns.split(", "))
    q = (df.writeStream.format("nsq").options(nsqdTCPAddresses=nsqd.tcp_address, topic=topic, **options)
         .outputMode(mode).option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    with pytest.raises(Exception) as info:
        q.awaitTermination(120)
    assert message in str(info.value)
    assert "UnboundLocalError" not in str(info.value)
    assert topic_stats(nsqd, topic) is None


def test_stream_sink_allows_what_writestream_adds(spark, nsqd, topic, tmp_path):
    """writeStream hands checkpointLocation and queryName to the sink with the user's options."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("x\ny\n")
    q = (spark.readStream.format("text").load(str(src)).selectExpr("value as body").writeStream.format("nsq")
         .options(nsqdTCPAddresses=nsqd.tcp_address, topic=topic).queryName(f"q_{topic}")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert topic_stats(nsqd, topic)["message_count"] == 2
