"""The CLI machinery shared by every command (cli/app.py): signals, outages, stderr lines."""

from __future__ import annotations

import re
import signal
import subprocess
import time

from helpers import NSQCLI, clean_env


# -- signals at start-up, warnings that repeat, whole lines on stderr ---------------------------------
def _block_stop_signals():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def test_a_signal_in_the_first_moments_exits_cleanly(nsqd, topic):
    """SIGTERM/SIGINT at any moment of start-up (0-150 ms: while Python starts, while click and the
    client core are imported, while tail connects): no traceback, a documented exit code. The
    signals are blocked across exec (as a supervisor may leave them), so every delay lands on
    nsqcli's own code whatever the machine's speed: nsqcli installs its handling first thing, then
    unblocks them (before the fix the signals stayed pending and tail ran on)."""
    delays = [0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15]
    for i, delay in enumerate(delays):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        p = subprocess.Popen(NSQCLI + ["tail", topic, "-c", "early#ephemeral", "--nsqd-tcp-address", nsqd.tcp_address],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
                             preexec_fn=_block_stop_signals)
        time.sleep(delay)
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise AssertionError(f"{sig.name} after {delay}s was never handled") from None
        text = err.decode(errors="replace")
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (sig.name, delay, text)
        assert p.returncode in (0, 128 + sig), (sig.name, delay, p.returncode, text)
        assert all(ln.startswith("nsqcli: ") for ln in text.splitlines()), (sig.name, delay, text)


def test_outages_said_when_they_start_counted_while_they_last_and_recovered():
    from nsqcli.cli.app import App, Outages

    said = []
    app = App()
    app.warn = lambda t: said.append("warning: " + t)
    app.info = lambda t: said.append(t)
    now = [100.0]
    o = Outages(app, every=30.0, clock=lambda: now[0], wall=lambda: 0.0)
    for _ in range(9):  # one server failing the same way on every reconnect
        o.failed("a", "a: refused")
        now[0] += 1
    assert said == ["warning: a: refused"]
    now[0] += 30
    o.failed("a", "a: refused")  # due again: said with the count
    o.failed("a", "a: timed out")  # changed: said at once
    assert said[1].startswith("warning: a: refused (x10 since ") and said[2].startswith("warning: a: timed out (x11 ")
    o.ok("b")  # was not failing: nothing
    o.ok("a", "nsqd a")
    assert said[3].startswith("recovered: nsqd a (11 failures since ") and len(said) == 4
    o.ok("a")
    o.failed("a", "a: refused")  # a later outage is said again
    assert said[4:] == ["warning: a: refused"]


def test_stderr_lines_from_many_threads_stay_whole(tmp_path):
    script = tmp_path / "many.py"
    script.write_text(
        "import threading\n"
        "from nsqcli.cli.app import App\n"
        "app = App()\n"
        "def spam(n):\n"
        "    for i in range(2000):\n"
        "        (app.warn if i % 2 else app.info)(f'thread {n} line {i} ' + 'x' * (i % 50))\n"
        "ts = [threading.Thread(target=spam, args=(n,)) for n in range(8)]\n"
        "[t.start() for t in ts]\n"
        "[t.join() for t in ts]\n")
    import sys

    r = subprocess.run([sys.executable, str(script)], capture_output=True, env=clean_env(), timeout=60)
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 0 and len(lines) == 16000
    assert all(re.fullmatch(r"nsqcli: (warning: )?thread \d line \d+ x*", ln) for ln in lines), \
        [ln for ln in lines if not re.fullmatch(r"nsqcli: (warning: )?thread \d line \d+ x*", ln)][:3]
