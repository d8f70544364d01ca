"""`nsqcli replay`, `query` and `to-parquet` end to end: the real CLI (each run starts its own
local[2] Spark) against real nsqd, with archives written by the real `nsqcli to-file`."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tests.support.helpers import NSQCLI, channel_stats, clean_env, drained, topic_stats, wait_for
from tests.support.spark_runs import nsqcli, shutdown_jvm
from tests.spark.test_datasource import drain, publish, run_to_file

# the first test pays for the archive fixture and the module's JVM launch (20-40 s on a saturated CI
# machine); a pytest-timeout inside a py4j call breaks the JVM the runs here share
pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SPARK = ["--master", "local[2]"]


@pytest.fixture(scope="module", autouse=True)
def _shared_jvm():
    """The runs here share one JVM (tests/support/spark_runs.py), ended with the module."""
    yield
    shutdown_jvm()


@pytest.fixture(scope="module")
def archive(tmp_path_factory, sandbox):
    """A JSON archive written by `nsqcli to-file`: 60 messages in two waves a few seconds apart
    (the wave boundary is the time to select by), on topics ev_a and ev_b."""
    nsqd = sandbox.nsqd
    out = tmp_path_factory.mktemp("archive")
    procs = [run_to_file(nsqd, t, out, "--format", "json") for t in ("ev_a", "ev_b")]
    try:
        for t in ("ev_a", "ev_b"):
            wait_for(lambda: (channel_stats(nsqd, t, "nsqcli_to_file") or {}).get("clients"), 15)
        publish(nsqd, "ev_a", [b"first-a-%d" % i for i in range(20)])
        publish(nsqd, "ev_b", [b"first-b-%d" % i for i in range(10)])
        time.sleep(1.2)
        boundary = time.time()
        time.sleep(1.2)
        publish(nsqd, "ev_a", [b"second-a-%d" % i for i in range(20)])
        publish(nsqd, "ev_b", [b"second-b-%d" % i for i in range(10)])
        # all in the channel (depth 0 also holds before the topic's pump has copied them), all FINed
        for t, n in (("ev_a", 40), ("ev_b", 20)):
            wait_for(lambda: drained(nsqd, t, "nsqcli_to_file", total=n), 20, what=f"{t} archived")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            assert p.wait(30) == 0
    return out, boundary


def iso(t: float) -> str:
    import datetime as dt
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="microseconds")


def test_replay_selects_exactly_by_time_where_and_topic(archive, nsqd, topic):
    path, boundary = archive
    r = nsqcli(["replay", str(path), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, *SPARK,
                "--since", iso(boundary), "--from-topic", "ev_a", "--where", "body_text like '%1%'"])
    assert r.returncode == 0, r.stderr
    expected = {b"second-a-%d" % i for i in range(20) if "1" in str(i)}
    assert r.stderr.strip().splitlines()[-1].startswith(f"nsqcli: replayed {len(expected)} messages into {topic}")
    assert topic_stats(nsqd, topic)["message_count"] == len(expected)
    r = nsqcli(["replay", str(path), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, *SPARK,
                "--until", iso(boundary)])
    assert r.returncode == 0, r.stderr
    assert topic_stats(nsqd, topic)["message_count"] == len(expected) + 30


def test_replay_dry_run_counts_by_topic_and_hour_publishes_nothing(archive, nsqd, topic, monkeypatch):
    import datetime as dt

    path, boundary = archive
    # on a machine in a half-hour zone: the hours said are still UTC's (pyspark collects a
    # timestamp in local time: 15:00Z came out as "20:00")
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        r = nsqcli(["replay", str(path), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, *SPARK, "--dry-run"])
    finally:
        monkeypatch.undo()
        time.tzset()
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["TOPIC", "HOUR", "(UTC)", "MESSAGES"]
    rows = [line.split() for line in r.stdout.strip().splitlines()[1:]]
    counts: dict = {}
    for row in rows:
        counts[row[0]] = counts.get(row[0], 0) + int(row[-1])
    assert counts == {"ev_a": 40, "ev_b": 20}
    # the archive was written within a few seconds of the boundary
    hours = {dt.datetime.fromtimestamp(boundary + d, dt.timezone.utc).strftime("%Y-%m-%d %H:00") for d in (-10, 10)}
    assert {f"{row[1]} {row[2]}" for row in rows} <= hours, (rows, hours)
    assert "dry run: 60 messages would be published" in r.stderr
    assert topic_stats(nsqd, topic) is None


def test_replayed_bodies_arrive_intact(archive, nsqd, topic):
    from tests.support.helpers import http_post

    path, _ = archive
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="check")
    r = nsqcli(["replay", str(path), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, *SPARK,
                "--from-topic", "ev_b", "--rate", "100"], real=True)  # the executable, as users run it
    assert r.returncode == 0, r.stderr
    got = sorted(m.body for m in drain(nsqd, topic, "check", 20))
    assert got == sorted([b"first-b-%d" % i for i in range(10)] + [b"second-b-%d" % i for i in range(10)])


def test_replay_bad_where_and_missing_archive_are_usage_errors(archive, nsqd, topic, tmp_path):
    path, _ = archive
    r = nsqcli(["replay", str(path), "-t", topic, "--nsqd-tcp-address", nsqd.tcp_address, *SPARK,
                "--where", "nope = 1"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "UNRESOLVED_COLUMN" in r.stderr, r.stderr
    r = nsqcli(["replay", str(tmp_path / "missing"), "-t", topic, *SPARK])
    assert r.returncode == 2 and "no such archive file or directory" in r.stderr


def test_query_in_three_formats_and_bad_sql(archive):
    path, _ = archive
    sql = "select topic, count(*) as n, min(attempts) as a from messages group by topic order by topic"
    r = nsqcli(["query", sql, "-a", str(path), *SPARK])
    assert r.returncode == 0, r.stderr
    assert [line.split() for line in r.stdout.strip().splitlines()] == [["topic", "n", "a"], ["ev_a", "40", "1"],
                                                                        ["ev_b", "20", "1"]]
    r = nsqcli(["query", "select body_text, body from messages where topic = 'ev_b' order by body_text", "-a",
                str(path), *SPARK, "--json", "--limit", "3"])
    assert r.returncode == 0, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["body_text"] for d in docs] == ["first-b-0", "first-b-1", "first-b-2"]
    import base64
    assert base64.b64decode(docs[0]["body"]) == b"first-b-0"
    r = nsqcli(["query", sql, "-a", str(path), *SPARK, "--csv"], real=True)  # the executable, as users run it
    assert r.returncode == 0, r.stderr
    assert list(csv.reader(io.StringIO(r.stdout))) == [["topic", "n", "a"], ["ev_a", "40", "1"], ["ev_b", "20", "1"]]
    r = nsqcli(["query", "select * frm messages", "-a", str(path), *SPARK])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("nsqcli: error: [PARSE_SYNTAX_ERROR]")


def test_to_parquet_available_now_writes_every_message(nsqd, topic, tmp_path):
    """With --nsqd-http-address the driver plans from the channel depth (batches of <= 500)."""
    bodies = {b"pq-%d" % i for i in range(2000)}
    publish(nsqd, topic, sorted(bodies))
    out, ck = tmp_path / "out", tmp_path / "ck"
    r = nsqcli(["to-parquet", "-t", topic, "-o", str(out), "--checkpoint", str(ck), "--available-now",
                "--nsqd-http-address", nsqd.http_address, *SPARK, "--max-messages-per-batch", "500"], timeout=240)
    assert r.returncode == 0, r.stderr
    assert "to-parquet: 2000 rows" in r.stderr
    import pyarrow.dataset as ds
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    assert set(table.column("body").to_pylist()) == bodies and table.num_rows == 2000
    assert (out / f"topic={topic}").is_dir()
    ch = channel_stats(nsqd, topic, "nsqcli_to_parquet")
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0
    plans = [json.loads(f.read_text().splitlines()[-1])["plan"] for f in (ck / "offsets").iterdir()
             if f.name.isdigit()]
    assert len(plans) == 4 and all(sum(s for *_, s in plan) == 500 for plan in plans)
    assert (ck / "spool").is_dir()  # the spool beside the checkpoint by default


@pytest.mark.spark_lts
@pytest.mark.timeout(240)
def test_to_parquet_available_now_ends_under_a_steady_publisher(nsqd, topic, tmp_path):
    """--available-now takes as many as the channel held at the start and ends, though more keeps
    coming (on Spark < 4.2 the query is started again until that many are taken). The publisher
    begins once the first batch is planned: what came before that is part of 'what the channel
    held', and on Spark < 4.2 each start takes one batch, so a publisher from the JVM's launch
    on made the run as long as the launch (a loaded machine: past the test's 200 s)."""
    import threading

    publish(nsqd, topic, [b"first-%d" % i for i in range(600)])
    stop = threading.Event()
    out, ck = tmp_path / "out", tmp_path / "ck"
    k_box = [0]  # publishes so far

    def more():
        while not (ck / "offsets" / "0").exists():
            if stop.wait(0.05):
                return
        while not stop.wait(0.1):
            publish(nsqd, topic, [b"more-%d-%d" % (k_box[0], i) for i in range(40)])  # 400/s: 2 batches/s
            k_box[0] += 1

    t = threading.Thread(target=more, daemon=True)
    t.start()
    try:
        r = nsqcli(["to-parquet", "-t", topic, "-o", str(out), "--checkpoint", str(ck), "--available-now",
                    "--nsqd-http-address", nsqd.http_address, *SPARK, "--max-messages-per-batch", "200"],
                   timeout=200)
    finally:
        during_run = k_box[0]
        stop.set()
        t.join()
    assert r.returncode == 0, r.stderr
    assert during_run, "the publisher never ran while to-parquet did: the test proved nothing"
    import pyarrow.dataset as ds
    bodies = ds.dataset(str(out), format="parquet", partitioning="hive").to_table().column("body").to_pylist()
    assert len(bodies) >= 600 and len(bodies) == len(set(bodies))  # as many as its first plan saw, none twice
    # which ones is nsqd's order: one given back (a take's surplus) goes behind those published
    # since, and stays for the next run (a clean-clone run left first-597..599): still in the channel
    missing = {b"first-%d" % i for i in range(600)} - set(bodies)
    if missing:
        wait_for(lambda: channel_stats(nsqd, topic, "nsqcli_to_parquet")["in_flight_count"] == 0, 30,
                 what="nothing in flight")
        left = drain(nsqd, topic, "nsqcli_to_parquet", channel_stats(nsqd, topic, "nsqcli_to_parquet")["depth"])
        assert missing <= {m.body for m in left}, sorted(missing)[:5]


def committed_bodies(out) -> list:
    """Bodies in the Parquet sink's committed files (its _spark_metadata log), as Spark reads it."""
    import pyarrow.parquet as pq

    files = set()
    for f in sorted((out / "_spark_metadata").iterdir()):
        if f.name.removesuffix(".compact").isdigit():  # N.compact: every entry up to batch N
            files |= {json.loads(line)["path"].removeprefix("file://") for line in f.read_text().splitlines()[1:]
                      if json.loads(line)["action"] == "add"}
    return [b for f in files for b in pq.read_table(f, columns=["body"]).column("body").to_pylist()]


@pytest.mark.spark_lts
@pytest.mark.timeout(300)
def test_to_parquet_available_now_after_a_crash_takes_the_interrupted_batch_and_the_rest(nsqd, topic, tmp_path):
    """kill -9 while a batch is planned but not committed, more published, then --available-now:
    the interrupted batch runs again and everything after it is taken too (review: on Spark < 4.2
    the target was the interrupted batch's old depth, and 2,000 messages stayed in nsqd)."""
    publish(nsqd, topic, [b"a-%d" % i for i in range(1000)])
    out, ck = tmp_path / "out", tmp_path / "ck"
    base = ["to-parquet", "-t", topic, "-o", str(out), "--checkpoint", str(ck), "--nsqd-http-address",
            nsqd.http_address, *SPARK, "--max-messages-per-batch", "500"]  # on Spark < 4.2 a start each
    p = subprocess.Popen(NSQCLI + base + ["--trigger", "3s"], env=clean_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)

    def numbered(d):
        return {f.name for f in d.iterdir() if f.name.isdigit()} if d.exists() else set()
    try:
        wait_for(lambda: len(numbered(ck / "offsets")) >= 2 and numbered(ck / "offsets") - numbered(ck / "commits"),
                 120, interval=0.02, what="a batch planned, not committed")
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
    publish(nsqd, topic, [b"b-%d" % i for i in range(1000)])
    r = nsqcli(base + ["--available-now"], timeout=240)
    assert r.returncode == 0, r.stderr
    bodies = committed_bodies(out)
    assert sorted(bodies) == sorted([b"a-%d" % i for i in range(1000)] + [b"b-%d" % i for i in range(1000)]), r.stderr
    assert channel_stats(nsqd, topic, "nsqcli_to_parquet")["depth"] == 0


@pytest.mark.timeout(240)
def test_to_parquet_sigterm_then_restart_loses_and_repeats_nothing(nsqd, topic, tmp_path):
    bodies = {b"sig-%d" % i for i in range(3000)}
    publish(nsqd, topic, sorted(bodies))
    out, ck = tmp_path / "out", tmp_path / "ck"
    base = ["to-parquet", "-t", topic, "-o", str(out), "--checkpoint", str(ck), "--nsqd-tcp-address",
            nsqd.tcp_address, *SPARK, "--trigger", "0"]
    p = subprocess.Popen(NSQCLI + base + ["--max-messages-per-batch", "200"], env=clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    commits = ck / "commits"
    wait_for(lambda: commits.exists() and len([f for f in commits.iterdir() if f.name.isdigit()]) >= 3, 120,
             interval=0.1, what="three committed batches")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "to-parquet: stopping" in err
    # the rest in batches of 1000 (the cap may change between runs; the batch the stop
    # interrupted, if any, runs again as it was planned)
    r = nsqcli(base + ["--available-now", "--max-messages-per-batch", "1000"], timeout=240)
    assert r.returncode == 0, r.stderr
    import pyarrow.dataset as ds
    files = committed_files(out)  # what Spark's readers see: the batches the sink committed
    got = ds.dataset(files, format="parquet", partitioning=ds.partitioning(flavor="hive"),
                     partition_base_dir=str(out)).to_table().column("body").to_pylist()
    assert set(got) == bodies
    assert len(got) == len(bodies)  # exactly once: no dedupe, no wait for msg_timeout


def committed_files(out) -> list[str]:
    """The Parquet files Spark's file sink committed (its _spark_metadata log, compactions too)."""
    import urllib.parse

    paths = set()
    for log in sorted((out / "_spark_metadata").iterdir()):
        if not log.name.split(".")[0].isdigit():
            continue
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            path = urllib.parse.urlsplit(entry["path"]).path
            if entry.get("action", "add") == "add":
                paths.add(urllib.parse.unquote(path))
            else:
                paths.discard(urllib.parse.unquote(path))
    return sorted(paths)


@pytest.mark.parametrize("missing", ["pyspark", "pyarrow"])
@pytest.mark.parametrize("argv", [["query", "select 1", "-a", "."], ["to-parquet", "-t", "x", "-o", "o", "--checkpoint", "ck"]],
                         ids=["query", "to-parquet"])
def test_spark_commands_without_the_extra_say_what_to_install(tmp_path, missing, argv):
    code = (f"import sys; sys.modules[{missing!r}] = None; sys.argv = ['nsqcli', *{argv!r}]; "
            "from nsqcli.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=30,
                       cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"nsqcli: error: nsqcli {argv[0]} needs the spark extra:"), r.stderr
    assert "pip install 'nsqcli[spark]'" in r.stderr and f"({missing} is not installed)" in r.stderr
    assert r.stderr.count("\n") == 1


def test_replay_failure_says_what_was_acknowledged(archive, topic):
    path, _ = archive
    r = nsqcli(["replay", str(path), "-t", topic, "--nsqd-tcp-address", "127.0.0.1:1", "--retry-timeout", "1s",
                *SPARK])
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("nsqcli: error: ") and "Connection refused" in last
    assert "nsqd acknowledged 0 messages (" in last and "tasks stopped early" in last and "at-least-once" in last


@pytest.mark.parametrize("args, message", [
    (["to-parquet", "-t", "x", "-o", "/tmp/o", "--checkpoint", "/tmp/c", "--partition-by", "topic,day"],
     "--partition-by: unknown column 'day'"),
    (["to-parquet", "-t", "x", "-o", "/tmp/o"], "Missing option '--checkpoint'"),
    (["to-parquet", "-t", "x", "-o", "/tmp/o", "--checkpoint", "/tmp/c", "--spool", "s3a://b/spool"],
     "--spool s3a://b/spool: the spool is written by Python tasks with POSIX calls"),
    (["to-parquet", "-t", "x", "-o", "/tmp/o", "--checkpoint", "s3a://b/ck"], "give --spool DIR"),
    (["replay", ".", "-t", "x", "--since", "2026-11-22T10:00Z", "--until", "2026-11-22T09:00Z"],
     "--since must be before --until"),
    (["replay", ".", "-t", "x", "--since", "yesterday"], "is not a time"),
    (["query", "select 1", "-a", ".", "--json", "--csv"], "--json and --csv cannot be used together"),
    (["query", "select 1", "-a", ".", "--conf", "novalue"], "--conf 'novalue': expected KEY=VALUE"),
])
def test_spark_commands_refuse_bad_input_in_one_line(args, message):
    r = nsqcli(args, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("nsqcli: error: ") and message in r.stderr
    assert r.stdout == ""
