"""Fixtures on REAL nsqd/nsqlookupd processes (nsqcli.sandbox). Nothing here mocks nsqd.

- ``sandbox``: session-scoped nsqlookupd + nsqd on 127.0.0.1.
- ``nsqd`` / ``lookupd``: its servers.
- ``topic``: a unique topic name per test.
- ``extra_nsqd()``: start a 2nd/3rd nsqd registered with the session lookupd (stopped after the test).
- ``nsqd_factory(**NsqdOptions)``: a separate nsqd with its own flags (TLS, auth, ...).
- ``toxiproxy``: a real toxiproxy-server on a free loopback port (tests/support/toxiproxy.py).

Which NSQ: v1.3.0 from .nsq/bin by default. ``NSQCLI_TEST_NSQ_VERSION=v1.2.1`` runs every server
these fixtures start (and the Go tools the interop tests run) from .nsq/versions/v1.2.1/bin
(scripts/install-nsq v1.2.1 builds it); the run refuses to start unless that nsqd says it is
that version, so a missing build never falls back to v1.3.0 silently. ``make test`` runs the
whole suite on v1.3.0, then the server-facing subset (COMPAT_TESTS in the Makefile) on v1.2.1.
In that second pass a test marked ``nsq_1_3("why")`` is deselected (it asserts what only v1.3.0
does), and so is each test in COMPAT_LEFT_OUT below (client-side logic, covered on v1.3.0).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import pytest

# A developer's saved contexts (~/.config/nsqcli) must not steer the tests: every test and every
# nsqcli the tests start sees this empty config directory unless it sets its own.
os.environ["NSQCLI_CONFIG_DIR"] = tempfile.mkdtemp(prefix="nsqcli-test-config-")

# Started as a background job of a non-interactive shell (`make test &`, a CI wrapper), this
# process and every nsqcli it starts would ignore SIGINT - as they should - and the Ctrl-C tests
# would fail for that reason alone: a handler here is reset to the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Every Spark driver the tests start (their session, `nsqcli replay/query/to-parquet`, driver
# scripts, the Connect server) starts with the quick compiler and, when `make test` made one,
# a class-data-sharing archive of Spark's classes (scripts/spark-cds): start-up is most of what
# the short Spark tests spend. nsqcli itself sets neither.
_cds = Path(sys.prefix) / "spark-cds.jsa"
_jvm = " ".join(filter(None, ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                              f"-XX:SharedArchiveFile={_cds}" if _cds.exists() else "",
                              "-Xlog:disable -Xlog:all=error:stderr")))
if _jvm not in os.environ.get("SPARK_SUBMIT_OPTS", ""):  # an xdist worker has the controller's already
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, (os.environ.get("SPARK_SUBMIT_OPTS"), _jvm)))
# ...and reads the tests' own spark-defaults.conf (a developer's SPARK_CONF_DIR must not steer the
# tests either): the executors of the standalone-cluster tests start as the drivers do (their CPU
# there -12%), and Delta's log replay, 2 stages of 50 tasks by default, runs 2 tasks a stage (a
# new JVM reading a 15-commit table: 22 s -> 10 s). Neither changes what a test asserts.
_spark_conf = Path(tempfile.mkdtemp(prefix="nsqcli-test-spark-conf-"))
(_spark_conf / "spark-defaults.conf").write_text(f"spark.executor.extraJavaOptions {_jvm}\n"
                                                 "spark.databricks.delta.snapshotPartitions 2\n")
os.environ["SPARK_CONF_DIR"] = str(_spark_conf)

import nsqcli.client.consumer  # noqa: E402
from nsqcli.nsq_install import NSQ_VERSION, version_dir  # noqa: E402

# every consumer the tests run in this process checks, at each RDY it writes, that the RDY of all
# its connections adds up to no more than max_in_flight (a "never", checked on every event)
nsqcli.client.consumer.CHECK_RDY_TOTAL = True
from nsqcli.sandbox import NsqdOptions, Sandbox  # noqa: E402

_counter = itertools.count()
ROOT = Path(__file__).resolve().parent.parent
TEST_NSQ_VERSION = os.environ.get("NSQCLI_TEST_NSQ_VERSION") or NSQ_VERSION
if TEST_NSQ_VERSION != NSQ_VERSION and not os.environ.get("NSQCLI_NSQ_BIN"):
    os.environ["NSQCLI_NSQ_BIN"] = str(version_dir(ROOT, TEST_NSQ_VERSION))

# Left out of the second (older-NSQ) pass only to keep CI short: each tests what nsqcli does
# around a hung node, a signal, a clock or a restart - client-side logic that the first pass
# covers on v1.3.0 - and takes seconds. What talks to nsqd (protocol, /stats, errors, TLS,
# auth, requeue, the HTTP API) stays in.
COMPAT_LEFT_OUT = (
    "tests/cli/test_to_file.py::test_losing_the_nsqd_is_said_once_counted_and_recovered",
    "tests/cli/test_to_file.py::test_to_file_syncs_on_time_while_lookupd_hangs",
    "tests/cli/test_to_file.py::test_silent_sub_times_out_in_to_file",
    "tests/cli/test_admin.py::test_delete_that_fails_on_a_hung_nsqd_leaves_nsqlookupd_as_it_was",
    "tests/cli/test_tail.py::test_tail_timeout_is_the_whole_commands_deadline_with_a_hung_lookupd",
    "tests/cli/test_tail.py::test_tail_backlog_check_asks_every_node_at_once",
    "tests/cli/test_tail.py::test_tail_prints_a_healthy_nodes_messages_while_hung_ones_time_out",
    "tests/cli/test_mpub.py::test_mpub_rate_holds_within_every_second",
    "tests/cli/test_mpub.py::test_an_interrupted_mpub_says_exactly_where_to_resume",
    "tests/cli/test_mpub.py::test_mpub_signal_says_exactly_what_was_acknowledged",
    "tests/cli/test_mpub.py::test_a_signal_while_nsqd_stalls_ends_at_once_with_what_it_may_hold",
    "tests/cli/test_mpub.py::test_a_second_sigint_still_says_where_to_resume",
    "tests/cli/test_pub.py::test_a_slow_handshake_may_spend_the_whole_deadline",
    "tests/cli/test_tail.py::test_tail_says_what_it_waits_for",
    "tests/cli/test_to_file.py::test_rotation_by_interval_and_datetime_change",
)


#: the fixtures that give a test real NSQ servers of the release under test
SERVER_FIXTURES = {"sandbox", "nsqd", "lookupd", "extra_nsqd", "nsqd_factory", "toxiproxy"}


def _nsqd_version() -> tuple[str, str]:
    """(path, `nsqd --version` line) of the nsqd the fixtures will start."""
    import subprocess

    from nsqcli.sandbox import find_binary

    path = find_binary("nsqd")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    return path, out


def pytest_configure(config):
    if TEST_NSQ_VERSION == NSQ_VERSION and not os.environ.get("NSQCLI_TEST_NSQ_VERSION"):
        return
    try:
        path, out = _nsqd_version()
    except Exception as e:  # noqa: BLE001 - any failure here is the same one line
        raise pytest.UsageError(f"NSQCLI_TEST_NSQ_VERSION={TEST_NSQ_VERSION}: no nsqd to run ({e}); "
                                f"build it with: scripts/install-nsq {TEST_NSQ_VERSION}") from None
    if f"nsqd v{TEST_NSQ_VERSION.lstrip('v')} " not in out + " ":
        raise pytest.UsageError(f"NSQCLI_TEST_NSQ_VERSION={TEST_NSQ_VERSION}, but {path} says {out!r}: "
                                f"build it with: scripts/install-nsq {TEST_NSQ_VERSION}")


def pytest_report_header(config):
    try:
        path, out = _nsqd_version()
    except Exception as e:  # noqa: BLE001
        return f"nsqd: none found ({e})"
    return f"nsqd: {out} ({path})"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("spark") is not None:
            # under pytest-xdist (make test's Spark passes: --dist loadgroup) the Spark tests run
            # in groups of whole files, a worker each. "spark-own-jvms": no SparkSession of the
            # tests; the spark commands and tables run in that process, sharing a JVM
            # (tests/support/spark_runs.py). "spark-servers": the standalone cluster (its drivers
            # run in that process as well) and the Connect server (its clients are processes of
            # their own). "spark-session": the tests on the session's local[2,3]. Their tests take
            # 229 s, 170 s and 215 s (--durations=0, the Spark pass alone, -n 2); the spark_lts
            # pass has no servers' tests.
            name = item.path.name
            group = ("spark-servers" if name in ("test_cluster.py", "test_connect.py")
                     else "spark-own-jvms" if name in ("test_spark_commands.py", "test_tables.py")
                     else "spark-session")
            item.add_marker(pytest.mark.xdist_group(group))
    for item in items:
        mark = item.get_closest_marker("nsq_1_3")
        if mark is not None and not (mark.args and isinstance(mark.args[0], str) and mark.args[0].strip()):
            raise pytest.UsageError(f"{item.nodeid}: nsq_1_3 needs its reason: @pytest.mark.nsq_1_3(\"why\")")
    if TEST_NSQ_VERSION == NSQ_VERSION:
        return
    keep, drop = [], []
    for item in items:
        left_out = item.nodeid.split("[", 1)[0] in COMPAT_LEFT_OUT
        # the older release's pass is for what talks to a server: a test with no server of the
        # sandbox (nor one it starts itself, marked nsq_server) would run the same code again
        serverless = (not SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
                      and item.get_closest_marker("nsq_server") is None)
        (drop if left_out or serverless or item.get_closest_marker("nsq_1_3") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _grouped_as_marked(request):
    """Under --dist loadgroup (an xdist worker) a test with an xdist_group mark must have its group
    in its node id, else the scheduler spreads the group over every worker: pytest 9.2 with
    pytest-xdist 3.8 drops it silently (pytest-xdist#1386). Said here instead."""
    if (getattr(request.config.option, "loadgroup", False) and "@" not in request.node.nodeid
            and request.node.get_closest_marker("xdist_group") is not None):
        pytest.fail("--dist loadgroup does not group here (the xdist_group marks are not in the node ids: "
                    "pytest-xdist#1386); install pytest < 9.2 (pyproject.toml's test extra)", pytrace=False)


@pytest.fixture(autouse=True)
def _rdy_never_above_max_in_flight():
    """Fails a test during which any consumer of this process wrote RDY that made its total
    above max_in_flight (nsqcli.client.consumer checks it at every RDY it writes)."""
    breaches = nsqcli.client.consumer.RDY_BREACHES
    breaches.clear()
    yield
    assert not breaches, breaches[:3]


@pytest.fixture(scope="session")
def sandbox():
    # nsqd's 100 ms queue scan (in-flight timeouts, deferred messages) looks at 20 channels
    # drawn at random from all of them: with the hundreds of channels the suite leaves on this
    # nsqd, a REQ'd or timed-out message came back seconds late, at random. Every channel is
    # looked at in every scan here, as on an nsqd with few channels.
    sb = Sandbox(NsqdOptions(extra_args=["--queue-scan-selection-count=10000"]))
    sb.start()  # raises SandboxError with the install hint: a missing nsqd FAILS, never skips
    yield sb
    sb.stop()


@pytest.fixture
def nsqd(sandbox):
    if not sandbox.nsqd.running:  # a test may have killed it
        sandbox.nsqd.restart()
    return sandbox.nsqd


@pytest.fixture
def lookupd(sandbox):
    return sandbox.lookupd


@pytest.fixture
def topic(request) -> str:
    base = re.sub(r"[^a-zA-Z0-9_-]", "_", request.node.name)[:40]
    return f"t{next(_counter)}_{base}"


@pytest.fixture
def extra_nsqd(sandbox):
    started = []

    def start(options: NsqdOptions | None = None):
        server = sandbox.add_nsqd(options or NsqdOptions())
        started.append(server)
        return server

    yield start
    for server in started:
        sandbox.remove_nsqd(server)


@pytest.fixture
def nsqd_factory(tmp_path):
    boxes = []

    def start(**options):
        sb = Sandbox(NsqdOptions(**options), with_lookupd=False, base_dir=str(tmp_path / f"box{len(boxes)}"))
        boxes.append(sb)
        return sb.start().nsqd

    yield start
    for sb in boxes:
        sb.stop()


@pytest.fixture
def toxiproxy(tmp_path):
    """A real toxiproxy-server of this test (stopped, with its proxies, after it). Missing
    toxiproxy-server FAILS with the install hint, never skips."""
    from tests.support.toxiproxy import Toxiproxy, ToxiproxyError

    try:
        tp = Toxiproxy.start(tmp_path / "toxiproxy")
    except ToxiproxyError as e:
        pytest.fail(str(e), pytrace=False)
    yield tp
    tp.stop()


@pytest.fixture(scope="session")
def spark():
    """One real SparkSession for the session: local[2,3] (2 cores, a failed task is retried up
    to 3 times, as on a cluster). Missing Java or pyspark FAILS with one line, never skips."""
    import os
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java is missing: the Spark tests need a JDK 17 on PATH (or JAVA_HOME)", pytrace=False)
    try:
        from pyspark.sql import SparkSession
        import pyarrow  # noqa: F401
    except ImportError as e:
        pytest.fail(f"the Spark tests need the spark extra: pip install -e '.[spark]' ({e})", pytrace=False)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (SparkSession.builder.master("local[2,3]").appName("nsqcli-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
               .config("spark.driver.host", "127.0.0.1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    from nsqcli.spark import register
    register(session)
    yield session
    session.stop()


def pytest_sessionfinish(session, exitstatus):
    """Under CI a skipped test is a failure: integration tests must really run."""
    import shutil

    shutil.rmtree(os.environ.get("NSQCLI_CONFIG_DIR", "/nonexistent"), ignore_errors=True)
    shutil.rmtree(_spark_conf, ignore_errors=True)

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("CI") and skipped and exitstatus == 0:
        reporter.write_line(f"CI: {skipped} test(s) skipped - failing the run", red=True)
        session.exitstatus = 1

