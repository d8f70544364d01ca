"""Fixtures on REAL nsqd/nsqlookupd processes (nsqcli.sandbox). Nothing here mocks nsqd.

- ``sandbox``: session-scoped nsqlookupd + nsqd on 127.0.0.1.
- ``nsqd`` / ``lookupd``: its servers.
- ``topic``: a unique topic name per test.
- ``extra_nsqd()``: start a 2nd/3rd nsqd registered with the session lookupd (stopped after the test).
- ``nsqd_factory(**NsqdOptions)``: a separate nsqd with its own flags (TLS, auth, ...).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A developer's saved contexts (~/.config/nsqcli) must not steer the tests: every test and every
# nsqcli the tests start sees this empty config directory unless it sets its own.
os.environ["NSQCLI_CONFIG_DIR"] = tempfile.mkdtemp(prefix="nsqcli-test-config-")

# Started as a background job of a non-interactive shell (`make test &`, a CI wrapper), this
# process and every nsqcli it starts would ignore SIGINT - as they should - and the Ctrl-C tests
# would fail for that reason alone: a handler here is reset to the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from nsqcli.sandbox import NsqdOptions, Sandbox  # noqa: E402

_counter = itertools.count()


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

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("CI") and skipped and exitstatus == 0:
        reporter.write_line(f"CI: {skipped} test(s) skipped - failing the run", red=True)
        session.exitstatus = 1
