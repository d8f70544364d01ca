"""nsqcli.spark on a real SparkSession (local[2,3]) and real nsqd: the sink, the streaming source
with FIN after commit, TOUCH, a driver crash, and archives written by `nsqcli to-file`.
The standalone-cluster test is in test_spark_cluster.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import NSQCLI, channel_stats, clean_env, drained, http_post, topic_stats, wait_for

# the session's JVM launch counts against the first test (20-40 s on a saturated CI machine), and
# a pytest-timeout inside a py4j call breaks the session for the tests after it
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent.parent


def publish(nsqd, topic: str, bodies: list[bytes]) -> None:
    from nsqcli.client.producer import Producer

    with Producer(nsqd.tcp_address) as p:
        assert p.multi_publish(topic, bodies).published == len(bodies)


def create_channel(nsqd, topic: str, channel: str) -> None:
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel=channel)


def drain(nsqd, topic: str, channel: str, n: int, timeout: float = 30.0) -> list:
    """Consume exactly n messages (FINed) from a channel; fail if fewer arrive."""
    from nsqcli.client.config import Config
    from nsqcli.client.consumer import Consumer

    c = Consumer(topic, channel, pull=True, config=Config(max_in_flight=2500),
                 nsqd_tcp_addresses=[nsqd.tcp_address]).start()
    got: list = []
    try:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            msgs = c.poll(n - len(got), timeout=0.5)
            got += msgs
            c.finish_many(msgs)
    finally:
        c.stop()
    assert len(got) == n, f"{len(got)} of {n} messages arrived"
    return got


def nsq_opts(nsqd, **extra) -> dict:
    return {"nsqdTCPAddresses": nsqd.tcp_address, **{k: str(v) for k, v in extra.items()}}


# -- install and scope ----------------------------------------------------------------------------
def test_nsqcli_pub_never_loads_pyspark(nsqd, topic):
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "nsqcli", "pub", "-t", topic, "hello",
                        "--nsqd-tcp-address", nsqd.tcp_address], capture_output=True, text=True,
                       env=clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr[-500:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if "|" in line]
    assert "nsqcli.client.producer" in imported  # the real pub ran
    assert not [m for m in imported if m.split(".")[0] in ("pyspark", "pyarrow", "py4j")]
    assert topic_stats(nsqd, topic)["message_count"] == 1


# -- sink -----------------------------------------------------------------------------------------
def test_batch_write_100k_rows_lands_exactly(spark, nsqd, topic):
    create_channel(nsqd, topic, "check")
    df = spark.range(100_000).selectExpr("concat('row-', cast(id as string)) as body").repartition(3)
    df.write.format("nsq").options(**nsq_opts(nsqd, topic=topic, batchSize=1000)).mode("append").save()
    assert topic_stats(nsqd, topic)["message_count"] == 100_000
    assert channel_stats(nsqd, topic, "check")["depth"] == 100_000
    bodies = {m.body for m in drain(nsqd, topic, "check", 100_000)}
    assert bodies == {b"row-%d" % i for i in range(100_000)}


def test_write_binary_bodies_per_row_topics_and_defer(spark, nsqd, topic):
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    t1, t2 = topic + "_a", topic + "_b"
    for t in (t1, t2):
        create_channel(nsqd, t, "check")
    rows = ([(bytes([i % 256, 0, 10, 255]) + b"%d" % i, t1, None) for i in range(300)]
            + [(b"b%d" % i, t2, None) for i in range(200)]
            + [(b"late%d" % i, t2, 60_000) for i in range(5)])
    schema = StructType([StructField("body", BinaryType()), StructField("topic", StringType()),
                         StructField("defer_ms", LongType())])
    spark.createDataFrame(rows, schema).repartition(2).write.format("nsq").options(**nsq_opts(nsqd)).mode("append").save()
    assert topic_stats(nsqd, t1)["message_count"] == 300
    assert topic_stats(nsqd, t2)["message_count"] == 205
    c2 = channel_stats(nsqd, t2, "check")
    assert c2["deferred_count"] == 5 and c2["depth"] == 200
    assert {m.body for m in drain(nsqd, t1, "check", 300)} == {r[0] for r in rows[:300]}


def test_streaming_sink_publishes_each_file_line(spark, nsqd, topic, tmp_path):
    create_channel(nsqd, topic, "check")
    src = tmp_path / "in"
    src.mkdir()
    for k in range(3):
        (src / f"part{k}.txt").write_text("".join(f"line-{k}-{i}\n" for i in range(400)))
    q = (spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(str(src))
         .selectExpr("value as body").writeStream.format("nsq")
         .options(**nsq_opts(nsqd, topic=topic)).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert topic_stats(nsqd, topic)["message_count"] == 1200
    assert {m.body for m in drain(nsqd, topic, "check", 1200)} == {
        b"line-%d-%d" % (k, i) for k in range(3) for i in range(400)}


@pytest.mark.parametrize("columns, options, message", [
    ("cast(id as string) as value", {"topic": "x"}, "has no 'body' column"),
    ("id as body", {"topic": "x"}, "column 'body' must be binary or string, not bigint"),
    ("cast(id as string) as body", {}, "give option 'topic' or a 'topic' column"),
    ("cast(id as string) as body, id as topic", {}, "column 'topic' must be a string"),
    ("cast(id as string) as body", {"topic": "bad topic!"}, "option 'topic'"),
    ("cast(id as string) as body", {"topic": "x", "ratePerSecond": "10"}, "option 'ratePerSecond' is gone"),
    ("cast(id as string) as body", {"topic": "x", "retryTimeout": "soon"}, "option 'retryTimeout' must be a duration"),
    ("cast(id as string) as body", {"topic": "x", "batchSize": "lots"}, "option 'batchSize' must be an integer"),
])
def test_bad_schema_or_option_fails_at_planning(spark, nsqd, columns, options, message):
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    df = spark.range(3).selectExpr(*columns.split(", "))
    options = {"nsqdTCPAddresses": nsqd.tcp_address, **options}
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        df.write.format("nsq").options(**options).mode("append").save()
    assert message in str(info.value)
    assert "nsq data source: " in str(info.value)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before  # no task ran
    assert topic_stats(nsqd, "x") is None or topic_stats(nsqd, "x")["message_count"] == 0


def test_sink_fails_over_to_the_next_nsqd(spark, nsqd, topic):
    dead = "127.0.0.1:1"
    create_channel(nsqd, topic, "check")
    df = spark.range(1000).selectExpr("cast(id as string) as body").repartition(2)
    (df.write.format("nsq").option("nsqdTCPAddresses", f"{dead},{nsqd.tcp_address}")
     .option("topic", topic).option("retryTimeout", "0").mode("append").save())
    assert topic_stats(nsqd, topic)["message_count"] == 1000


def test_sink_task_fails_clearly_when_no_nsqd_answers(spark, topic):
    df = spark.range(10).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception) as info:
        (df.write.format("nsq").option("nsqdTCPAddresses", "127.0.0.1:1").option("topic", topic)
         .option("retryTimeout", "300ms").option("retryBackoff", "100ms").mode("append").save())
    text = str(info.value)
    assert "nsq sink, partition" in text and "published 0 of" in text and "Connection refused" in text


def test_sink_rate_per_task_paces_each_task(spark, nsqd, topic):
    df = spark.range(600).selectExpr("cast(id as string) as body").repartition(2)
    t0 = time.monotonic()
    (df.write.format("nsq").options(**nsq_opts(nsqd, topic=topic, ratePerTask=150)).mode("append").save())
    elapsed = time.monotonic() - t0
    assert topic_stats(nsqd, topic)["message_count"] == 600
    assert elapsed >= 1.8, f"2 tasks of 300 messages at 150/s each took only {elapsed:.2f}s"


# -- streaming source: tests/spark/test_source.py -------------------------------------------------
def test_source_bad_options_fail_with_one_clear_message(spark, nsqd):
    with pytest.raises(Exception) as info:
        spark.readStream.format("nsq").option("nsqdTCPAddresses", nsqd.tcp_address).load() \
            .writeStream.format("noop").start().awaitTermination(60)
    assert "nsq data source: option 'topic' is required" in str(info.value)


# -- archives -----------------------------------------------------------------------------------------
def run_to_file(nsqd, topic, out: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen(NSQCLI + ["to-file", "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address,
                                      "--output-dir", str(out), "--host-identifier", "box-7",
                                      "--sync-interval", "200ms", *extra],
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.parametrize("fmt", ["raw", "json"])
def test_read_archive_written_by_to_file(spark, nsqd, topic, tmp_path, fmt):
    from nsqcli.spark import read_archive

    out = tmp_path / "archive"
    out.mkdir()
    extra = ["--gzip"] if fmt == "raw" else ["--format", "json"]
    t0 = time.time()
    proc = run_to_file(nsqd, topic, out, *extra)
    try:
        wait_for(lambda: (channel_stats(nsqd, topic, "nsqcli_to_file") or {}).get("clients"), 15,
                 what="to-file subscribed")
        bodies = [b"arch-%d \xe2\x9c\x93" % i for i in range(300)] + ([b"\xff\x00bin"] if fmt == "json" else [])
        publish(nsqd, topic, bodies)
        # all in the channel (depth 0 also holds before the topic's pump has copied them), all FINed
        wait_for(lambda: drained(nsqd, topic, "nsqcli_to_file", total=len(bodies)), 20, what="to-file FINed all")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
    t1 = time.time()
    files = list(out.iterdir())
    assert files and all(f.name.startswith(f"{topic}.box-7") for f in files)
    rows = read_archive(spark, str(out)).collect()
    assert sorted(r.body for r in rows) == sorted(bodies)
    assert {r.topic for r in rows} == {topic} and {r.host for r in rows} == {"box-7"}
    import datetime as dt
    # pyspark collects a timestamp as a naive datetime in this machine's local time
    hours = {r.hour.astimezone(dt.timezone.utc).replace(tzinfo=None) for r in rows}
    first = dt.datetime.fromtimestamp(t0, dt.timezone.utc).replace(minute=0, second=0, microsecond=0, tzinfo=None)
    last = dt.datetime.fromtimestamp(t1, dt.timezone.utc).replace(minute=0, second=0, microsecond=0, tzinfo=None)
    assert hours <= {first, last}, hours
    assert all(r.file.endswith(".gz") for r in rows) == (fmt == "raw")
    if fmt == "json":
        assert {r.nsqd for r in rows} == {nsqd.tcp_address} and {r.attempts for r in rows} == {1}
        assert {r.channel for r in rows} == {"nsqcli_to_file"}
        assert len({r.id for r in rows}) == len(bodies) and all(len(r.id) == 16 for r in rows)
        assert all(t0 - 1 <= r.timestamp.timestamp() <= t1 + 1 for r in rows)
    else:
        assert {r.id for r in rows} == {None} and {r.timestamp for r in rows} == {None}


def test_read_archive_stream_follows_new_files(spark, tmp_path):
    from nsqcli.spark import read_archive

    d = tmp_path / "out"
    d.mkdir()
    (d / "ev.host.2026-11-22_08.log").write_bytes(b"one\ntwo\n")
    sink = tmp_path / "sink"
    q = (read_archive(spark, str(d), stream=True, format="raw").writeStream.format("parquet")
         .option("path", str(sink)).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    (d / "ev.host.2026-11-22_09.log").write_bytes(b"three\n")
    q = (read_archive(spark, str(d), stream=True, format="raw").writeStream.format("parquet")
         .option("path", str(sink)).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    rows = spark.read.parquet(str(sink)).collect()
    assert sorted(r.body for r in rows) == [b"one", b"three", b"two"]  # each file read once
    import datetime as dt
    assert {r.hour.astimezone(dt.timezone.utc).hour for r in rows} == {8, 9}  # collected in local time


def test_dry_run_hours_are_utc_hours_floored_also_before_1970(spark):
    """replay --dry-run's counts (nsqcli.spark.jobs): an envelope's timestamp, else the file
    name's hour, floored to its UTC hour - also before 1970, where a division truncating toward
    zero gave the next hour (review)."""
    import datetime as dt

    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    from nsqcli.spark.jobs import counts_by_topic_and_hour

    def utc(*a):
        return dt.datetime(*a, tzinfo=dt.timezone.utc)

    rows = [("t", utc(1969, 12, 31, 23, 30), None), ("t", utc(1969, 12, 31, 22, 59, 59), None),
            ("t", utc(1960, 6, 1, 5, 10), None), ("t", utc(2026, 11, 22, 9, 59, 59, 999999), None),
            ("t", utc(2026, 11, 22, 9), None), ("t", None, utc(2026, 11, 22, 10)), ("u", None, None)]
    schema = StructType([StructField("topic", StringType()), StructField("timestamp", TimestampType()),
                         StructField("hour", TimestampType())])
    got = counts_by_topic_and_hour(spark.createDataFrame(rows, schema))
    assert got == [("t", utc(1960, 6, 1, 5), 1), ("t", utc(1969, 12, 31, 22), 1), ("t", utc(1969, 12, 31, 23), 1),
                   ("t", utc(2026, 11, 22, 9), 2), ("t", utc(2026, 11, 22, 10), 1), ("u", None, 1)]
