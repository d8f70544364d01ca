"""The nsq streaming source on a real SparkSession (local[2,3]) and real nsqd: planned on the
driver from nsqd's /stats, read on the executors, exactly once through the spool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.helpers import channel_stats, clean_env, wait_for

# the session's JVM launch counts against the first test (20-40 s on a saturated CI machine), and
# a pytest-timeout inside a py4j call breaks the session for the tests after it
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent.parent


def spark_version() -> tuple[int, int]:
    import pyspark
    return tuple(int(x) for x in pyspark.__version__.split(".")[:2])


#: Spark 4.2+ drains with trigger(availableNow=True) in batches; 4.0/4.1 fall back to Trigger.Once
#: for a Python source (one batch per start, the interrupted one first after a crash)
IN_BATCHES = spark_version() >= (4, 2)


def committed(spark, out: Path) -> int:
    """Rows in the Parquet sink's committed files (0 before its first commit), from the sink's
    own log and the files' footers: no Spark job per look (a wait polls this every 0.5 s on a
    2-core machine that also runs the query it waits for)."""
    import pyarrow.parquet as pq
    from urllib.parse import unquote, urlparse

    meta = out / "_spark_metadata"
    # a batch's log entry is a file named by its number, or N.compact every 10 batches (holding
    # the earlier entries too); ".N.<uuid>.tmp" while it is written
    logs = [p for p in meta.iterdir() if p.name.split(".")[0].isdigit() and not p.name.startswith(".")] \
        if meta.exists() else []
    paths = set()
    for log in logs:
        for line in log.read_text().splitlines()[1:]:  # after the "v1" version line
            entry = json.loads(line)
            if not entry.get("isDir") and entry.get("action", "add") == "add":
                paths.add(unquote(urlparse(entry["path"]).path))
    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


def offset_json(text: str) -> dict:
    """An offset from StreamingQueryProgress: JSON, except on pyspark 4.0 whose recentProgress
    gives str() of the parsed dict."""
    import ast
    try:
        return json.loads(text)
    except ValueError:
        return ast.literal_eval(text)


def available_now(start, timeout: float = 180) -> int:
    """Run ``start()`` (a query with trigger(availableNow=True)) until it has taken everything, as
    a user does: once on Spark >= 4.2; on 4.0/4.1 again until a start takes no rows. How many starts."""
    starts = 0
    while True:
        q = start()
        q.awaitTermination(timeout)
        assert q.exception() is None, q.exception()
        starts += 1
        if IN_BATCHES or not any(p.numInputRows for p in q.recentProgress):
            return starts
        assert starts < 50, "trigger(availableNow=True) never ran out of rows"


def publish(nsqd, topic: str, bodies: list[bytes]) -> None:
    from nsqcli.client.producer import Producer

    with Producer(nsqd.tcp_address) as p:
        for i in range(0, len(bodies), 5000):
            assert p.multi_publish(topic, bodies[i:i + 5000]).published == len(bodies[i:i + 5000])


def source(spark, nsqd, topic, spool, http=True, **options):
    reader = (spark.readStream.format("nsq").option("topic", topic).option("spoolLocation", str(spool))
              .option("nsqdHTTPAddresses" if http else "nsqdTCPAddresses",
                      nsqd.http_address if http else nsqd.tcp_address))
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def settle(nsqd, topic, channel="nsqcli_spark"):
    """The channel once nothing is in flight (late REQs and FINs have landed)."""
    return wait_for(lambda: (lambda c: c if c and c["in_flight_count"] == 0 else None)(
        channel_stats(nsqd, topic, channel)), 20, what="nothing in flight")


@pytest.mark.spark_lts
@pytest.mark.parametrize("http", [True, False], ids=["depth-from-stats", "tcp-address-only"])
def test_available_now_takes_everything_exactly_once(spark, nsqd, topic, tmp_path, http):
    bodies = [b"msg-%05d" % i for i in range(2500)]
    publish(nsqd, topic, bodies)
    starts = available_now(lambda: (
        source(spark, nsqd, topic, tmp_path / "spool", http, maxMessagesPerBatch=1000,
               maxMessagesPerPartition=400, channel="spark", spoolRetention=0)  # review: stopped early
        .writeStream.format("parquet").option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()))
    assert starts == 1 if IN_BATCHES else starts >= 3  # Spark < 4.2: one batch of <= 1000 per start
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.body for r in rows) == bodies  # every message, none twice
    assert {r.topic for r in rows} == {topic} and {r.channel for r in rows} == {"spark"}
    assert {r.nsqd for r in rows} == {nsqd.tcp_address} and {r.attempts for r in rows} == {1}
    if http:  # the plan followed the depth: batches of <= 1000 (1000, 1000, 500) in tasks of <= 400
        ends = [json.loads((tmp_path / "ck" / "offsets" / p.name).read_text().splitlines()[-1])
                for p in (tmp_path / "ck" / "offsets").iterdir() if p.name.isdigit()]
        plans = [e["plan"] for e in ends]
        assert all(sum(s for _, _, s in pl) <= 1000 and all(s <= 400 for _, _, s in pl) for pl in plans)
        assert sum(s for pl in plans for _, _, s in pl) == 2500 and len(plans) == 3
    ch = settle(nsqd, topic, "spark")
    assert ch["depth"] == 0 and ch["timeout_count"] == 0 and ch["requeue_count"] == 0


@pytest.mark.spark_lts
def test_tasks_fin_after_the_spool_and_commit_deletes_it(spark, nsqd, topic, tmp_path):
    """A batch's messages are FINed by its tasks once spooled: a slow sink holds nothing in
    flight at nsqd. The spool of a batch goes when Spark commits it."""
    publish(nsqd, topic, [b"a%d" % i for i in range(50)])
    entered, release = threading.Event(), threading.Event()
    seen: list[int] = []
    spool = tmp_path / "spool"

    def hold_first_batch(df, batch_id):
        seen.append(df.count())
        if batch_id == 0:
            entered.set()
            release.wait(60)

    q = (source(spark, nsqd, topic, spool, maxMessagesPerPartition=20, spoolRetention=0)
         .writeStream.foreachBatch(hold_first_batch).trigger(processingTime="500 milliseconds").start())
    try:
        assert entered.wait(90), "the first batch never started"
        ch = channel_stats(nsqd, topic, "nsqcli_spark")
        assert ch["in_flight_count"] == 0 and ch["depth"] == 0 and ch["deferred_count"] == 0  # FINed
        epochs = list(spool.iterdir())
        assert len(epochs) == 1 and [p.name for p in epochs[0].iterdir()] == ["1"]
        slots = sorted(p.name for p in (epochs[0] / "1").iterdir())
        assert slots == ["0.0", "0.1", "1.0", "1.1", "2.0", "2.1"]  # 3 tasks: a chunk and END each
        release.set()
        publish(nsqd, topic, [b"b%d" % i for i in range(5)])  # batch 2 is planned: batch 1 committed
        wait_for(lambda: sum(seen) == 55, 60, what="the second batch")
        # a committed batch stays until the next commit (its END markers are the metrics)
        publish(nsqd, topic, [b"c%d" % i for i in range(5)])  # batch 3 planned: batch 2 committed
        wait_for(lambda: sum(seen) == 60, 60, what="the third batch")
        wait_for(lambda: not (epochs[0] / "1").exists(), 30, what="the committed spool deleted")
        progress = [p for p in q.recentProgress if p.numInputRows]
        # every Spark shows the batch before's lateness in a batch's endOffset; 4.2+ also shows
        # the metrics of the last planning in latestOffset. The batch they describe is named.
        end = offset_json(progress[-1].sources[0].endOffset)
        assert end["lastBatchSpooledRows"] == {1: 50, 2: 5}[end["lastBatch"]]
        assert end["lastBatchOldestMessageAgeMs"] >= 0 and end["lastBatchRedelivered"] == 0
        if IN_BATCHES:
            latest = json.loads(progress[-1].sources[0].latestOffset)
            assert latest["lastBatchSpooledRows"] == {1: 50, 2: 5}[latest["lastBatch"]]
            assert latest["lastBatchOldestMessageAgeMs"] >= 0 and latest["channelDepth"] >= 0
    finally:
        release.set()
        q.stop()


def test_a_task_run_again_reads_its_spool_and_a_racing_attempt_loses_cleanly(nsqd, topic, tmp_path):
    """What Spark does to tasks - a retry, a speculative copy running at the same time - played
    directly on the reader's read() (no Spark scheduling needed): every attempt returns the same
    rows, each message is taken from nsqd once, and the loser's messages go back (REQ)."""
    pytest.importorskip("pyarrow")
    from nsqcli.spark.plan import Part, SourceSettings
    from nsqcli.spark.spool import prepare
    from nsqcli.spark.take import take

    publish(nsqd, topic, [b"r%04d" % i for i in range(3000)])
    s = SourceSettings({"topic": topic, "nsqdTCPAddresses": nsqd.tcp_address,
                        # 3 s: the winner's second gather waits for the loser's REQs (a busy machine
                        # can take more than a few hundred ms to send them)
                        "spoolLocation": str(tmp_path / "spool"), "readIdleTimeout": "3s"})
    part = Part(topic, nsqd.tcp_address, 2000)
    prepare(str(tmp_path / "spool"), "e1", 1)  # the driver does this when it plans the batch
    results: list = [None, None]

    def attempt(i):
        results[i] = list(take(s, part, "e1", 1, 0))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    bodies = [[b for rb in r for b in rb.column("body").to_pylist()] for r in results]
    assert bodies[0] == bodies[1] and len(bodies[0]) == 2000 and len(set(bodies[0])) == 2000
    again = list(take(s, part, "e1", 1, 0))  # a retry after both finished: the spool, not nsqd
    assert [b for rb in again for b in rb.column("body").to_pylist()] == bodies[0]
    ch = settle(nsqd, topic)
    assert ch["depth"] == 1000 and ch["deferred_count"] == 0 and ch["timeout_count"] == 0  # the rest stays, for others


TAKER = r'''
import sys, time
from nsqcli.spark.plan import Part, SourceSettings
from nsqcli.spark.take import take
import nsqcli.spark.spool as spool
topic, tcp, root, when = sys.argv[1:5]
spool.prepare(root, "e1", 3)
s = SourceSettings({"topic": topic, "nsqdTCPAddresses": tcp, "spoolLocation": root, "msgTimeout": "2s"})
real = spool.PartitionSpool.publish
def hang_at_the_second_chunk(self, slot, data):
    if slot == 1 and when == "before-publish":  # 2500 messages held by this process only
        print("holding", flush=True)
        time.sleep(60)
    ok = real(self, slot, data)
    if slot == 1 and when == "before-fin":  # spooled, and nsqd never gets the FIN
        print("holding", flush=True)
        time.sleep(60)
    return ok
spool.PartitionSpool.publish = hang_at_the_second_chunk
list(take(s, Part(topic, tcp, 6000), "e1", 3, 0))
'''


@pytest.mark.parametrize("when", ["before-publish", "before-fin"])
def test_a_task_killed_mid_read_loses_and_repeats_nothing(nsqd, topic, tmp_path, when):
    """kill -9 of a task holding a chunk: its retry keeps the published chunks, and the killed
    task's held messages come back from nsqd after msg_timeout. Killed after publishing a chunk
    and before its FIN, nsqd delivers that chunk again: it is recognised in the spool, FINed,
    and not taken twice."""
    from nsqcli.spark.plan import SourceSettings

    bodies = [b"k%05d" % i for i in range(6000)]
    publish(nsqd, topic, bodies)
    script = tmp_path / "taker.py"
    script.write_text(TAKER)
    root = str(tmp_path / "spool")
    p = subprocess.Popen([sys.executable, str(script), topic, nsqd.tcp_address, root, when], env=clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "holding", p.stderr.read()[-2000:]
    finally:
        p.kill()
        p.communicate(timeout=30)
    # the second chunk, held (or spooled, FIN never sent), comes back after msg_timeout (2 s)
    s = SourceSettings({"topic": topic, "nsqdTCPAddresses": nsqd.tcp_address, "spoolLocation": root,
                        "msgTimeout": "2s", "readIdleTimeout": "3s", "maxReadTime": "30s"})
    got = take_batches(s, nsqd, topic, root, 3)  # the retry, then later batches
    assert sorted(got) == bodies and len(got) == 6000  # every message once, across the batches
    ch = settle(nsqd, topic)
    assert ch["depth"] == 0 and ch["deferred_count"] == 0


def take_batches(s, nsqd, topic: str, root: str, first: int, share: int = 6000) -> list[bytes]:
    """Bodies of batch ``first`` (prepared by the caller), then of later batches until nsqd has
    nothing left in the channel: what a running query takes, without Spark."""
    from nsqcli.spark.plan import Part
    from nsqcli.spark.spool import prepare
    from nsqcli.spark.take import take

    batches = [list(take(s, Part(topic, nsqd.tcp_address, share), "e1", first, 0))]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ch = channel_stats(nsqd, topic, "nsqcli_spark")
        if ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["deferred_count"] == 0:
            break
        prepare(root, "e1", first + len(batches))
        batches.append(list(take(s, Part(topic, nsqd.tcp_address, share), "e1", first + len(batches), 0)))
    return [b for r in batches for rb in r for b in rb.column("body").to_pylist()]


def test_nsqd_restarting_between_spool_and_fin_repeats_nothing(nsqd, topic, tmp_path, monkeypatch, caplog):
    """nsqd stops after a chunk is spooled and before its FIN reaches it (it writes what is in
    flight to disk), then comes back: it delivers that chunk again (attempts 2), which is found in
    the spool and FINed, not taken twice; nothing is lost."""
    import nsqcli.spark.spool as spool
    from nsqcli.spark.plan import SourceSettings

    bodies = [b"n%05d" % i for i in range(6000)]
    publish(nsqd, topic, bodies)
    real = spool.PartitionSpool.publish
    restarted: list = []

    def restart_after_the_second_chunk(self, slot, data):
        ok = real(self, slot, data)
        if slot == 1 and not restarted:
            restarted.append(nsqd.restart())  # the chunk is spooled; its FIN can no longer arrive
        return ok

    monkeypatch.setattr(spool.PartitionSpool, "publish", restart_after_the_second_chunk)
    root = str(tmp_path / "spool")
    spool.prepare(root, "e1", 1)
    s = SourceSettings({"topic": topic, "nsqdTCPAddresses": nsqd.tcp_address, "spoolLocation": root,
                        "readIdleTimeout": "1s", "maxReadTime": "20s"})
    got = take_batches(s, nsqd, topic, root, 1)
    assert restarted
    assert sorted(got) == bodies and len(got) == 6000  # every message once, across the batches
    assert "were already spooled" in caplog.text  # the redelivered chunk came back and was recognised
    ch = settle(nsqd, topic)
    assert ch["depth"] == 0 and ch["deferred_count"] == 0


def stop_once_sent(nsqd, topic: str, root: str, n: int) -> threading.Thread:
    """request_stop() once nsqd has sent the task ``n`` messages (in flight to its channel), not
    after a guessed time: a stop asked before the task took anything (its start slowed by a busy
    machine) closes the partition empty, which is not what these tests are about."""
    from nsqcli.spark.spool import request_stop

    def run():
        wait_for(lambda: (channel_stats(nsqd, topic, "nsqcli_spark") or {}).get("in_flight_count", 0) >= n,
                 60, what=f"{n} messages in flight to the task")
        t.asked = request_stop(root)

    t = threading.Thread(target=run, daemon=True)
    t.asked = False
    t.start()
    return t


def test_a_stop_closes_a_trickling_partition_at_once_and_keeps_it_exact(nsqd, topic, tmp_path):
    """to-parquet on SIGTERM asks for a stop (.STOP in the newest batches): a task reading a slow
    trickle closes its partition at once with what it took (spooled, FINed, END), instead of
    filling its chunk until maxReadTime; running it again returns the same rows; the rest stays
    in the channel, and a marker left behind (a killed stop) does not touch later batches."""
    from nsqcli.client.producer import Producer
    from nsqcli.spark.plan import Part, SourceSettings
    from nsqcli.spark.spool import prepare, summaries
    from nsqcli.spark.take import take

    root = str(tmp_path / "spool")
    prepare(root, "e1", 1)
    s = SourceSettings({"topic": topic, "nsqdTCPAddresses": nsqd.tcp_address, "spoolLocation": root,
                        "maxReadTime": "120s", "readIdleTimeout": "10s"})
    publish(nsqd, topic, [b"t%05d" % i for i in range(10)])
    sent = [10]
    done = threading.Event()

    def trickle():
        with Producer(nsqd.tcp_address) as p:
            while not done.is_set() and sent[0] < 5000:
                p.publish(topic, b"t%05d" % sent[0])
                sent[0] += 1
                time.sleep(0.005)

    t = threading.Thread(target=trickle)
    t.start()
    rows: list = []
    try:
        stopper = stop_once_sent(nsqd, topic, root, 40)  # the 10 published first and 30 of the trickle
        started = time.monotonic()
        rows = [b for rb in take(s, Part(topic, nsqd.tcp_address, 100_000), "e1", 1, 0)
                for b in rb.column("body").to_pylist()]
        took = time.monotonic() - started
    finally:
        done.set()
        t.join()
    stopper.join(1)
    assert stopper.asked  # the take ended after the stop, not before it was asked
    assert took < 30, took  # closed at the stop, not at maxReadTime (120 s) or a full chunk (2500)
    assert 10 <= len(rows) < 2500 and len(set(rows)) == len(rows)
    [end] = summaries(root, "e1", 1)
    assert end["rows"] == len(rows)
    again = [b for rb in take(s, Part(topic, nsqd.tcp_address, 100_000), "e1", 1, 0)
             for b in rb.column("body").to_pylist()]
    assert again == rows  # the END marker holds: a retry reads the spool, not nsqd
    ch = settle(nsqd, topic)
    assert ch["depth"] + len(rows) == sent[0]  # what was not taken is still there, for the next batch
    publish(nsqd, topic, [b"u%05d" % i for i in range(100)])
    prepare(root, "e1", 2)  # the next batch, batch 1's marker still there (review: it starved every batch)
    later = [b for rb in take(s, Part(topic, nsqd.tcp_address, 50), "e1", 2, 0) for b in rb.column("body").to_pylist()]
    assert len(later) == 50 and not set(later) & set(rows)


def test_a_stop_does_not_wait_out_a_long_read_idle_timeout(nsqd, topic, tmp_path):
    """A task waiting on a quiet channel (readIdleTimeout 20 s) closes soon after a stop."""
    from nsqcli.spark.plan import Part, SourceSettings
    from nsqcli.spark.spool import prepare
    from nsqcli.spark.take import take

    root = str(tmp_path / "spool")
    prepare(root, "e1", 1)
    publish(nsqd, topic, [b"q%d" % i for i in range(10)])
    s = SourceSettings({"topic": topic, "nsqdTCPAddresses": nsqd.tcp_address, "spoolLocation": root,
                        "readIdleTimeout": "20s"})
    stopper = stop_once_sent(nsqd, topic, root, 10)
    started = time.monotonic()
    rows = sum(rb.num_rows for rb in take(s, Part(topic, nsqd.tcp_address, 1000), "e1", 1, 0))
    took = time.monotonic() - started
    stopper.join(1)
    assert stopper.asked
    assert rows == 10 and took < 10, took  # not the 20 s idle time (review: 20.1 s)


def test_available_now_takes_what_was_there_and_leaves_later_messages(spark, nsqd, topic, tmp_path):
    """AvailableNow takes what the channel held when the query started; what is published while
    it runs stays in the channel for the next run."""
    publish(nsqd, topic, [b"old%d" % i for i in range(200)])
    taken: list = []

    def sink(df, batch_id):
        taken.extend(r.body for r in df.collect())
        if batch_id == 0:
            publish(nsqd, topic, [b"new%d" % i for i in range(50)])

    q = (source(spark, nsqd, topic, tmp_path / "spool", maxMessagesPerBatch=100)
         .writeStream.foreachBatch(sink).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert sorted(taken) == sorted(b"old%d" % i for i in range(200))
    assert settle(nsqd, topic)["depth"] == 50


def test_redelivered_messages_of_another_topic_are_not_mistaken_for_spooled_ones(nsqd, topic, tmp_path):
    """nsqd's message ids are unique per topic only: two topics on one nsqd hand out the same
    ids. A redelivered message of topic B whose id a spooled message of topic A has must be
    taken, not FINed as already spooled (review: 1965 of 3000 lost)."""
    from nsqcli.spark.plan import Part, SourceSettings
    from nsqcli.spark.spool import prepare
    from nsqcli.spark.take import take

    a, b = topic + "_a", topic + "_b"
    from nsqcli.client.producer import Producer
    with Producer(nsqd.tcp_address) as p:
        for i in range(30):  # interleaved: the same id sequence in both topics
            p.multi_publish(a, [b"a%05d" % (i * 100 + j) for j in range(100)])
            p.multi_publish(b, [b"b%05d" % (i * 100 + j) for j in range(100)])
    root = str(tmp_path / "spool")
    opts = {"topic": f"{a},{b}", "nsqdTCPAddresses": nsqd.tcp_address, "spoolLocation": root,
            "readIdleTimeout": "3s"}  # the second chunk comes as the first is written: a busy machine is slow
    s = SourceSettings(opts)
    prepare(root, "e1", 1)
    got_a = list(take(s, Part(a, nsqd.tcp_address, 3000), "e1", 1, 0))
    # topic B, every message delivered once and given back (REQ): all come again with attempts 2
    from nsqcli.client.config import Config
    from nsqcli.client.consumer import Consumer
    c = Consumer(b, "nsqcli_spark", pull=True, config=Config(max_in_flight=2500),
                 nsqd_tcp_addresses=[nsqd.tcp_address]).start()
    try:
        held: list = []
        while len(held) < 2500:
            held += c.poll(2500 - len(held), timeout=5)
        c.drain(5.0)  # CLS first: a message REQed while RDY is up comes straight back to c
        c.requeue_many(held, 0.0)
    finally:
        c.stop()
    prepare(root, "e1", 2)
    got_b = list(take(s, Part(b, nsqd.tcp_address, 3000), "e1", 2, 0))
    assert sum(rb.num_rows for rb in got_a) == 3000
    assert sorted(x for rb in got_b for x in rb.column("body").to_pylist()) == [b"b%05d" % i for i in range(3000)]


def test_an_attempt_waking_after_its_batch_was_deleted_fins_nothing(nsqd, topic, tmp_path):
    """A zombie attempt of a committed batch whose spool the driver deleted must not FIN what
    it takes (nobody reads that spool): its publish fails and its messages go back."""
    from nsqcli.spark.plan import Part, SourceSettings
    from nsqcli.spark.take import take

    publish(nsqd, topic, [b"z%d" % i for i in range(100)])
    s = SourceSettings({"topic": topic, "nsqdTCPAddresses": nsqd.tcp_address,
                        "spoolLocation": str(tmp_path / "spool")})
    with pytest.raises(FileNotFoundError):
        list(take(s, Part(topic, nsqd.tcp_address, 100), "e1", 7, 0))  # batch 7's directory is gone
    ch = settle(nsqd, topic)
    assert ch["depth"] == 100 and not (tmp_path / "spool" / "e1" / "7").exists()


def test_big_bodies_close_chunks_by_bytes_and_a_failed_chunk_goes_back(nsqd, topic, tmp_path, monkeypatch):
    """Chunks close at a byte budget (2500 bodies of 1 MiB would overflow an Arrow column), and a
    chunk that fails before it is spooled is given back at once (review: stuck in flight)."""
    import nsqcli.spark.take as T
    from nsqcli.spark.plan import Part, SourceSettings
    from nsqcli.spark.spool import prepare

    monkeypatch.setattr(T, "CHUNK_BYTES", 100 * 1024)
    bodies = [b"%04d" % i + b"x" * 10_000 for i in range(100)]
    publish(nsqd, topic, bodies)
    root = str(tmp_path / "spool")
    s = SourceSettings({"topic": topic, "nsqdTCPAddresses": nsqd.tcp_address, "spoolLocation": root})
    prepare(root, "e1", 1)
    got = list(T.take(s, Part(topic, nsqd.tcp_address, 100), "e1", 1, 0))
    assert sorted(b for rb in got for b in rb.column("body").to_pylist()) == bodies
    assert len(got) >= 9 and all(rb.nbytes < 2 * 100 * 1024 + 64 * 1024 for rb in got)
    publish(nsqd, topic, bodies[:10])

    def broken(*a, **k):
        raise TypeError("cannot build the chunk")
    monkeypatch.setattr(T, "to_record_batch", broken)
    prepare(root, "e1", 2)
    with pytest.raises(TypeError):
        list(T.take(s, Part(topic, nsqd.tcp_address, 10), "e1", 2, 0))
    ch = settle(nsqd, topic)  # given back (REQ), not left in flight until msg_timeout
    assert ch["depth"] == 10


def test_old_checkpoints_and_old_spark_are_refused_clearly():
    from nsqcli.spark.plan import parse

    with pytest.raises(ValueError, match="written by an older nsqcli source.*new checkpointLocation"):
        parse({"seq": 1732000000})


DRIVER = r'''
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession
http, topic, out, ck, mode = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
from nsqcli.spark import register
register(spark)
w = (spark.readStream.format("nsq").option("nsqdHTTPAddresses", http).option("topic", topic)
     .option("maxMessagesPerBatch", sys.argv[6]).option("spoolLocation", ck + "/spool")
     .load().writeStream.format("parquet").option("path", out).option("checkpointLocation", ck))
if mode == "run":
    w.start().awaitTermination()
# Spark < 4.2 runs one batch per start of trigger(availableNow=True), the interrupted one first:
# a restarted driver starts the query again ("drain-again") until a start takes nothing
for _ in range(10 if mode == "drain-again" else 1):
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    if q.exception() is not None:
        raise q.exception()
    if not any(p.numInputRows for p in q.recentProgress):
        break
print("starts", _ + 1, flush=True)
'''


@pytest.mark.spark_lts
@pytest.mark.timeout(420)  # two drivers launched; 150 s of its own waits before the drain, the drain < 200 s
def test_driver_killed_mid_stream_then_restarted_loses_and_repeats_nothing(spark, nsqd, topic, tmp_path):
    bodies = [b"crash-%04d" % i for i in range(3000)]
    publish(nsqd, topic, bodies)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    out, ck = tmp_path / "out", tmp_path / "ck"
    args = [sys.executable, str(script), nsqd.http_address, topic, str(out), str(ck)]
    proc = subprocess.Popen(args + ["run", "150"], env=clean_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        commits = ck / "commits"
        wait_for(lambda: commits.exists() and len([p for p in commits.iterdir() if p.name.isdigit()]) >= 3,
                 120, interval=0.1, what="three committed batches")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and Python workers: a crash
        proc.communicate(timeout=30)
    done_before = len([p for p in commits.iterdir() if p.name.isdigit()])
    assert done_before < 3000 // 150, "the stream finished before the kill: nothing was tested"
    t0 = time.monotonic()
    # one restarted driver: the interrupted batch runs again, then the rest (in batches of 1000; on
    # Spark < 4.2 one batch per start, so in one, then a start that takes nothing)
    r = subprocess.run(args + ["drain", "1000"] if IN_BATCHES else args + ["drain-again", "100000"], env=clean_env(),
                       capture_output=True, text=True, timeout=240, start_new_session=True)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = spark.read.parquet(str(out)).select("body").collect()
    assert sorted(r.body for r in rows) == bodies  # nothing lost, nothing twice
    ch = settle(nsqd, topic)
    assert ch["depth"] == 0
    assert time.monotonic() - t0 < 200


@pytest.mark.spark_lts
def test_a_query_restarted_after_its_last_batch_committed_goes_on_where_it_ended(spark, nsqd, topic, tmp_path):
    """The restart Spark 4.0/4.1 give the source no start for: the newest batch committed, so
    nothing runs again. The query goes on in its epoch (spool, batch numbers)."""
    spool, out, ck = tmp_path / "spool", tmp_path / "out", tmp_path / "ck"

    def run(bodies: list[bytes], total: int) -> None:
        publish(nsqd, topic, bodies)
        q = (source(spark, nsqd, topic, spool, maxMessagesPerBatch=40, spoolRetention=0)
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(processingTime="200 milliseconds").start())
        try:
            wait_for(lambda: committed(spark, out) >= total, 90, interval=0.5, what=f"{total} rows")
        finally:
            q.stop()  # a clean stop: the last batch is committed

    first = [b"first-%03d" % i for i in range(100)]
    run(first, 100)
    batches = len([p for p in (ck / "offsets").iterdir() if p.name.isdigit()])
    second = [b"second-%03d" % i for i in range(60)]
    run(second, 160)
    rows = spark.read.parquet(str(out)).select("body").collect()
    assert sorted(r.body for r in rows) == sorted(first + second)  # nothing lost, nothing twice
    ends = [json.loads((ck / "offsets" / str(b)).read_text().splitlines()[-1])
            for b in range(len(list(p for p in (ck / "offsets").iterdir() if p.name.isdigit())))]
    assert len({e["epoch"] for e in ends}) == 1  # one epoch: the restart went on, not over
    assert [e["batch"] for e in ends] == list(range(1, len(ends) + 1)) and len(ends) > batches
    assert settle(nsqd, topic)["depth"] == 0


@pytest.mark.spark_lts
def test_two_queries_sharing_a_spool_location_each_get_exactly_their_own(spark, nsqd, topic, tmp_path):
    """Two running queries, one spoolLocation (review: on Spark 4.0/4.1 the second adopted the
    first's epoch from a file in the spool and the two swapped messages). Each query keeps its own
    epoch, so its own spool directories."""
    spool, topics = tmp_path / "spool", [topic + "_a", topic + "_b"]
    for t in topics:
        publish(nsqd, t, [b"%s-%04d" % (t.encode(), i) for i in range(600)])
    queries = [source(spark, nsqd, t, spool, maxMessagesPerBatch=100, spoolRetention=0)
               .writeStream.format("parquet").option("path", str(tmp_path / t))
               .option("checkpointLocation", str(tmp_path / f"ck_{t}")).trigger(processingTime="300 milliseconds")
               .start() for t in topics]
    try:
        wait_for(lambda: all(committed(spark, tmp_path / t) >= 600 for t in topics), 120, interval=0.5,
                 what="600 rows in each sink")
    finally:
        for q in queries:
            q.stop()
    for t in topics:
        rows = spark.read.parquet(str(tmp_path / t)).select("body").collect()
        assert sorted(r.body for r in rows) == [b"%s-%04d" % (t.encode(), i) for i in range(600)]
    assert len([p for p in spool.iterdir() if p.is_dir()]) == 2  # an epoch each
