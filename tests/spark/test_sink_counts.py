"""The nsq sink never prints a count it does not know (issue 34, part 3): what the committed tasks
acknowledged, what failed attempts acknowledged (commitReportPath), an nsqd restart survived
(retryTimeout), the rate per task. Real nsqd, the session's local[2,3] SparkSession (a failed
task is retried, as on a cluster); nsqd's /stats is the judge of every number."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.support.helpers import topic_stats

pytestmark = pytest.mark.spark


def depth(nsqd, topic) -> int:
    return topic_stats(nsqd, topic)["depth"]


def report_of(path) -> dict:
    return json.loads(path.read_text())


# -- the line: pure, every case -------------------------------------------------------------------
def M(partition, messages, attempt=0, attempt_id="", resent=0):
    from nsqcli.spark.sink import NSQCommitMessage

    return NSQCommitMessage(partition, messages, messages * 10, 1, 0, ["127.0.0.1:4150"], 0.1,
                            attempt=attempt, attempt_id=attempt_id, resent=resent)


def R(partition, attempt, acknowledged, final=True, id=None):
    return {"id": id or f"r{partition}{attempt}", "partition": partition, "attempt": attempt,
            "acknowledged": acknowledged, "final": final, "error": "x", "nsqd": ["127.0.0.1:4150"], "resent": 0}


def test_lines_say_only_what_is_known():
    from nsqcli.spark.sink_report import settle

    line, doc = settle([M(0, 100), M(1, 50)], None, True, "write committed")
    assert line == "nsqcli.spark: write committed: published 150 messages (1500 bytes) in 2 partitions to 127.0.0.1:4150"
    assert (doc["acknowledged"], doc["exact"]) == (150, True)

    # a retried task, no records: more landed, how many is not known
    line, doc = settle([M(0, 100, attempt=1), M(1, 50)], None, True, "write committed")
    assert line.endswith("; 1 task ran again after failed attempts, which published an unknown number more "
                         "(at least once: nsqd holds at least 150; option commitReportPath counts them)")
    assert doc["acknowledged"] is None and not doc["exact"]

    # with records: the failed attempts' counts are added
    line, doc = settle([M(0, 100, 1, "a"), M(1, 50, 0, "b")], [R(0, 0, 30), R(0, 1, 100, id="a"), R(1, 0, 50, id="b")],
                       True, "write committed")
    assert line.endswith("; 1 task ran again after failed attempts: 1 failed attempt published 30 more "
                         "(at least once): nsqd acknowledged 180 in all")
    assert (doc["acknowledged"], doc["exact"], doc["failed_attempts_acknowledged"]) == (180, True, 30)

    # an aborted job never says "published 0"
    line, _ = settle([None, None], None, False, "write ABORTED (published messages cannot be taken back)")
    assert "published 0" not in line
    assert line == ("nsqcli.spark: write ABORTED (published messages cannot be taken back): no task finished; 2 tasks "
                    "failed, which published an unknown number more (at least once: nsqd holds at least 0; option "
                    "commitReportPath counts them)")
    # a record not final (an attempt killed, or still running): "at least"
    line, doc = settle([M(0, 100, 0, "a"), None], [R(0, 0, 100, id="a"), R(1, 0, 39, final=False)], False, "write ABORTED")
    assert line == ("nsqcli.spark: write ABORTED: nsqd acknowledged 100 messages from the 1 task that finished; "
                    "1 task failed: 1 failed attempt published at least 39 more (at least once): nsqd acknowledged "
                    "at least 139 in all")
    assert (doc["acknowledged"], doc["exact"], doc["failed_tasks"]) == (139, False, [1])
    line, _ = settle([M(0, 100, resent=20)], None, True, "micro-batch 3")
    assert line.endswith("; up to 20 more may be in nsqd (taken by a connection that was lost before nsqd's "
                         "answer, and sent again)")


@pytest.mark.parametrize("options, message", [
    ({"ratePerSecond": "100"}, "option 'ratePerSecond' is gone: Spark does not tell a Python writer how many tasks "
     "run at once, so a whole write's rate cannot be kept; give 'ratePerTask'"),
    ({"numPartitions": "4"}, "option 'numPartitions' is gone (it split 'ratePerSecond'): give 'ratePerTask'"),
    ({"maxRetries": "3"}, "option 'maxRetries' is gone: give 'retryTimeout' (a duration, default 60s"),
])
def test_gone_options_name_what_to_use(options, message):
    from nsqcli.spark import options as opt

    with pytest.raises(opt.OptionError) as info:
        opt.check_options({"topic": "t", **options}, "sink")
    assert str(info.value).startswith("nsq data source: " + message)
    assert "\n" not in str(info.value)


# -- real writes ----------------------------------------------------------------------------------
def test_aborted_write_reports_what_failed_attempts_acknowledged(spark, nsqd_factory, topic, tmp_path):
    """Partition 1 ends with a message over nsqd's --max-msg-size: each of its 3 attempts
    publishes the 350 before it and fails; the job aborts. The report adds them all up, exactly
    what nsqd holds, and says aborted."""
    small = nsqd_factory(max_msg_size=64)
    report = tmp_path / "reports" / "write.json"
    df = spark.range(0, 701, 1, 2).selectExpr(  # partition 1: ids 350-700, the last one too big
        "case when id = 700 then repeat('x', 200) else concat('m-', cast(id as string)) end as body")
    with pytest.raises(Exception) as info:
        (df.write.format("nsq").option("nsqdTCPAddresses", small.tcp_address).option("topic", topic)
         .option("commitReportPath", str(report)).mode("append").save())
    assert "refused by nsqd" in str(info.value)
    doc = report_of(report)
    assert doc["state"] == "aborted" and doc["topic"] == topic
    assert doc["published"] == 350 and [p["messages"] for p in doc["partitions"]] == [350]
    assert doc["failed_tasks"] == [1] and len(doc["failed_attempts"]) == 3  # local[2,3]: 3 attempts
    assert [a["acknowledged"] for a in doc["failed_attempts"]] == [350, 350, 350]
    assert all(a["final"] for a in doc["failed_attempts"])
    assert doc["acknowledged"] == 1400 == depth(small, topic) and doc["exact"]
    assert "published 0" not in doc["line"] and doc["line"].endswith(
        "1 task failed: 3 failed attempts published 1050 more (at least once): nsqd acknowledged 1400 in all")
    assert not (tmp_path / "reports" / ".attempts").exists()  # the records are gone with the report


def test_retried_task_counts_its_failed_attempt(spark, nsqd_factory, topic, tmp_path):
    """Attempt 0 of partition 1 meets a too-big message after 250 rows, attempt 1 does not:
    the write commits, and the line and the report count the 250 that landed twice."""
    from pyspark.sql import functions as F

    small = nsqd_factory(max_msg_size=64)

    @F.udf("string")
    def body(i):
        from pyspark import TaskContext

        if i == 1250 and TaskContext.get().attemptNumber() == 0:
            return "x" * 200
        return f"m-{i}"

    report = tmp_path / "r.json"
    df = spark.range(0, 2000, 1, 2).select(body("id").alias("body"))  # partition 1: ids 1000-1999
    (df.write.format("nsq").option("nsqdTCPAddresses", small.tcp_address).option("topic", topic)
     .option("batchSize", "50").option("commitReportPath", f"file://{report}").mode("append").save())
    doc = report_of(report)
    assert doc["state"] == "committed" and doc["published"] == 2000
    assert doc["rerun_tasks"] == [1] and [a["acknowledged"] for a in doc["failed_attempts"]] == [250]
    assert doc["acknowledged"] == 2250 == depth(small, topic) and doc["exact"]
    assert doc["line"].startswith("nsqcli.spark: write committed: published 2000 messages (")
    assert doc["line"].endswith("; 1 task ran again after failed attempts: 1 failed attempt published 250 more "
                                "(at least once): nsqd acknowledged 2250 in all")


def test_write_survives_an_nsqd_restart(spark, nsqd_factory, topic, tmp_path):
    """nsqd stopped ~3 s into a paced write and started again on the same port and data path 5 s
    later: every task keeps trying (retryTimeout), the write commits, each row is in nsqd once
    (SIGTERM: nsqd keeps what it acknowledged) - or the line says how many may be twice."""
    from nsqcli.spark.sink import SinkSettings
    from pyspark.sql.types import StringType, StructField, StructType

    default = SinkSettings({"nsqdTCPAddresses": "127.0.0.1:1", "topic": "t"},
                           StructType([StructField("body", StringType())]))
    assert default.retry_timeout == 60.0  # the default outlasts a restart; this test gives it 20s
    nsqd = nsqd_factory()
    n = 24_000
    report = tmp_path / "r.json"
    df = spark.range(0, n, 1, 4).selectExpr("concat('r-', cast(id as string)) as body")
    events: dict = {}

    def outage():
        try:
            deadline = time.monotonic() + 60
            while (topic_stats(nsqd, topic) or {}).get("depth", 0) < 2000 and time.monotonic() < deadline:
                time.sleep(0.05)  # the tasks are publishing
            events["stopped_at_depth"] = depth(nsqd, topic)
            nsqd.stop()
            time.sleep(5.0)
            nsqd._start_retrying(15.0)
            events["started"] = True
        except Exception as e:  # seen in the assertion below
            events["error"] = repr(e)
        written.wait(120)  # nsqd dies with the thread that started it (PR_SET_PDEATHSIG): stay

    written = threading.Event()

    t = threading.Thread(target=outage)
    t.start()
    try:
        (df.write.format("nsq").option("nsqdTCPAddresses", nsqd.tcp_address).option("topic", topic)
         .option("ratePerTask", "1500").option("batchSize", "100").option("retryTimeout", "20s")
         .option("commitReportPath", str(report)).mode("append").save())
        got = depth(nsqd, topic)  # before the thread that restarted nsqd ends (and nsqd with it)
    finally:
        written.set()
        t.join(60)
    assert events.get("started") and events["stopped_at_depth"] < n, events  # in the middle of the write
    doc = report_of(report)
    assert doc["state"] == "committed" and doc["published"] == n and doc["rerun_tasks"] == [], doc["line"]
    assert sum(p["retries"] for p in doc["partitions"]) >= 1  # the tasks did go round again
    assert n <= got <= n + doc["may_be_duplicates"], (got, doc["line"])
    if doc["may_be_duplicates"] == 0:
        assert got == n and doc["acknowledged"] == n and doc["exact"]


def test_streaming_report_per_micro_batch(spark, nsqd, topic, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for k in range(2):
        (src / f"part{k}.txt").write_text("".join(f"line-{k}-{i}\n" for i in range(300)))
    reports = tmp_path / "reports"
    q = (spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(str(src))
         .selectExpr("value as body").writeStream.format("nsq")
         .option("nsqdTCPAddresses", nsqd.tcp_address).option("topic", topic)
         .option("commitReportPath", str(reports)).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert sorted(p.name for p in reports.iterdir()) == ["0.json", "1.json"]
    docs = [report_of(reports / f"{b}.json") for b in (0, 1)]
    assert [(d["batch_id"], d["state"], d["published"], d["exact"]) for d in docs] == [
        (0, "committed", 300, True), (1, "committed", 300, True)]
    assert docs[1]["line"].startswith("nsqcli.spark: micro-batch 1: published 300 messages")
    assert depth(nsqd, topic) == 600


def test_report_path_must_be_local_and_writable(spark, nsqd, topic, tmp_path):
    df = spark.range(3).selectExpr("cast(id as string) as body")
    for path, message in (("s3a://bucket/r.json", "option 'commitReportPath' must be a local path (or file:/...)"),
                          ("file:rel/r.json", "must be a local path (or file:/...)"),
                          (str(tmp_path), "is a directory; a batch write's report is one JSON file")):
        with pytest.raises(Exception) as info:
            (df.write.format("nsq").option("nsqdTCPAddresses", nsqd.tcp_address).option("topic", topic)
             .option("commitReportPath", path).mode("append").save())
        assert message in str(info.value)
    assert topic_stats(nsqd, topic) is None


def test_replay_rate_is_the_whole_writes(spark):
    """replay --rate N: each task gets N / (tasks running at once), not N / partitions."""
    from nsqcli.spark.jobs import rate_per_task

    assert spark.sparkContext.defaultParallelism == 2
    _, per_task = rate_per_task(spark.range(0, 100, 1, 8), 1000.0)
    assert per_task == 500.0
    _, per_task = rate_per_task(spark.range(0, 100, 1, 1), 1000.0)
    assert per_task == 1000.0
