"""Breaks of issue 36's everyday jobs found by trying them as a user would, against real nsqd:
each test failed before its fix."""

from __future__ import annotations

import threading

import pytest

from helpers import channel_stats, http_post, wait_for
from helpers import run_nsqcli as run
from hung import cluster  # noqa: F401 - the fixture
from test_tail_peek import two_nodes_env


def _env(nsqd) -> dict:
    return {"NSQCLI_NSQD_TCP_ADDRESS": nsqd.tcp_address, "NSQCLI_NSQD_HTTP_ADDRESS": nsqd.http_address}


def _ids(nsqd, topic: str) -> list[bytes]:
    r = run(["tail", topic, "-c", "billing", "--peek", "-f", "{id}"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_peek_over_topics_whose_message_ids_repeat_shows_every_message(nsqd, topic):
    # nsqd numbers each topic's messages on its own (its --node-id, the millisecond, a sequence):
    # two topics published to in the same millisecond have messages with the same id, as have two
    # nsqd on one host (the default --node-id comes from the host name). The peek took the second
    # for the first 'come round again' and ended early, showing part of the backlog.
    a, b = topic + "_a", topic + "_b"
    for t in (a, b):
        http_post(nsqd.http_address, "/topic/create", topic=t)
        http_post(nsqd.http_address, "/channel/create", topic=t, channel="billing")
    body = b"\n".join(b"m%d" % i for i in range(10))
    for _ in range(5):  # the same millisecond on both topics: two threads released together
        go = threading.Barrier(2)
        pubs = [threading.Thread(target=lambda t=t: (go.wait(), http_post(nsqd.http_address, "/mpub", body, topic=t)))
                for t in (a, b)]
        [p.start() for p in pubs]
        [p.join() for p in pubs]
    wait_for(lambda: all(channel_stats(nsqd, t, "billing")["depth"] == 50 for t in (a, b)), what="backlogs")
    shared = set(_ids(nsqd, a)) & set(_ids(nsqd, b))
    assert shared, "no message id in common: the test's premise (same millisecond on both topics) did not happen"
    r = run(["tail", a, b, "-c", "billing", "--peek", "-f", "{topic} {body}"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 100, (len(r.stdout.splitlines()), r.stderr)
    assert b"came round again" not in r.stderr, r.stderr
    for t in (a, b):
        ch = channel_stats(nsqd, t, "billing")
        assert ch["depth"] + ch["in_flight_count"] + ch["deferred_count"] == 50


def test_exec_with_n_taken_by_running_commands_holds_the_others_instead_of_a_requeue_loop(nsqd, topic):
    # exec -n 2 --concurrency 4: the 2 runs claimed -n; every other message delivered meanwhile was
    # REQ'd with no delay and came straight back, hundreds of times a second (requeue_count 3382
    # for 8 messages in half a second: their attempts, which --max-attempts counts, ruined)
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="work")
    http_post(nsqd.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(10)), topic=topic)
    r = run(["exec", topic, "-c", "work", "-n", "2", "--concurrency", "4", "--timeout", "20s", "--",
             "sh", "-c", "sleep 0.5; cat; echo"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2 and b"succeeded 2" in r.stderr, r.stderr
    wait_for(lambda: channel_stats(nsqd, topic, "work")["in_flight_count"] == 0, what="nothing in flight")
    ch = channel_stats(nsqd, topic, "work")
    assert ch["depth"] == 8 and ch["requeue_count"] <= 10, ch
    r = run(["tail", topic, "-c", "work", "-n", "8", "-f", "{attempts}", "--timeout", "10s"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert max(int(a) for a in r.stdout.split()) <= 3, r.stdout


def test_body_escaped_of_a_body_in_utf8_text_beyond_ascii(nsqd, topic):
    # {body_escaped} keeps printable UTF-8 as it is, then decoded it as ASCII: any body with an 'é'
    # broke the handler ("nsqcli: warning: source: 'ascii' codec can't decode..."), the connection
    # was dropped and the message left in flight until nsqd's message timeout
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="billing")
    http_post(nsqd.http_address, "/pub", "café\tключ\n\x1b]0;x\x07".encode() + b"\xff", topic=topic)
    r = run(["tail", topic, "-c", "billing", "--peek", "-n", "1", "-f", "{size} {body_escaped}", "--timeout", "10s"],
            _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == "22 café\\tключ\\n\\x1b]0;x\\x07\\xff\n", r.stdout
    assert b"warning" not in r.stderr, r.stderr
    wait_for(lambda: channel_stats(nsqd, topic, "billing")["in_flight_count"] == 0, timeout=3, what="given back")
    assert channel_stats(nsqd, topic, "billing")["depth"] == 1


def test_peek_with_max_in_flight_below_the_number_of_nsqd_looks_at_every_node(cluster, topic):
    # --max-in-flight 1 over three nsqd: the one RDY went to one node; once its backlog was looked
    # at, the message that came round again was held there, in flight, so that node never ran dry
    # and kept the RDY: the other nodes' backlogs were never sent (7 of 21 shown, then a stall
    # until --timeout, exit 0)
    cluster.add_nsqd()
    nodes = cluster.nsqds[:3]
    for node, n in zip(nodes, (7, 3, 11)):
        http_post(node.http_address, "/topic/create", topic=topic)
        http_post(node.http_address, "/channel/create", topic=topic, channel="billing")
        http_post(node.http_address, "/mpub", b"\n".join(b"%s-%d" % (node.tcp_address.encode(), i) for i in range(n)),
                  topic=topic)
    env = {"NSQCLI_NSQD_TCP_ADDRESS": " ".join(n.tcp_address for n in nodes),
           "NSQCLI_NSQD_HTTP_ADDRESS": " ".join(n.http_address for n in nodes)}
    for extra in (["--max-in-flight", "1"], ["-n", "2", "--grep", "nothing matches this"]):
        r = run(["tail", topic, "-c", "billing", "--peek", "--timeout", "12s", *extra], env)
        assert r.returncode == 0, r.stderr
        assert b"looked at 21 of" not in r.stderr and b"the 21 message(s) looked at" in r.stderr, (extra, r.stderr)
        assert len(set(r.stdout.splitlines())) == len(r.stdout.splitlines()) == (21 if extra[0] != "-n" else 0)
        for node, n in zip(nodes, (7, 3, 11)):
            wait_for(lambda: channel_stats(node, topic, "billing")["in_flight_count"] == 0, what="given back")
            ch = channel_stats(node, topic, "billing")
            assert ch["depth"] + ch["deferred_count"] == n and ch["message_count"] == n


def test_exec_command_timeout_and_touch_still_apply_after_the_command_closes_its_output(nsqd, topic):
    # COMMAND closed its stdout and stderr and went on running: with no pipe left to watch the run
    # waited for its exit with no TOUCH and no --command-timeout (sleep 8 ran its 8 s; with a
    # shorter --msg-timeout nsqd timed the message out and redelivered it, E_REQ_FAILED after)
    import time

    http_post(nsqd.http_address, "/pub", b"m", topic=topic)
    started = time.monotonic()
    r = run(["exec", topic, "-c", "w", "--command-timeout", "500ms", "--max-attempts", "1", "-n", "1",
             "--timeout", "20s", "--", "sh", "-c", "exec >&- 2>&-; sleep 8"], _env(nsqd))
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 6, r.stderr
    assert b"killed after --command-timeout 0.5s (attempt 1 of --max-attempts 1); FINed" in r.stderr, r.stderr
    c = channel_stats(nsqd, topic, "w")
    assert (c["depth"], c["in_flight_count"], c["requeue_count"], c["timeout_count"]) == (0, 0, 0, 0), (c, r.stderr)


def test_peek_stopping_early_on_one_node_with_a_backlog_on_disk_still_looks_at_the_other_nodes(cluster, topic):
    # one nsqd's backlog is partly on disk (beyond --mem-queue-size): there the peek stops early
    # (what it gives back comes round again mixed with the rest), but that ended the whole peek,
    # and the other node, all in memory, was cut short too (a few of its 40 shown)
    from nsqcli.sandbox import NsqdOptions

    disk, memory = cluster.add_nsqd(NsqdOptions(mem_queue_size=5)), cluster.nsqds[0]
    for node, n in ((disk, 60), (memory, 40)):
        http_post(node.http_address, "/topic/create", topic=topic)
        http_post(node.http_address, "/channel/create", topic=topic, channel="billing")
        http_post(node.http_address, "/mpub", b"\n".join(b"%s-%d" % (node.tcp_address.encode(), i) for i in range(n)),
                  topic=topic)
    wait_for(lambda: channel_stats(disk, topic, "billing")["depth"] == 60, what="backlog")
    env = {"NSQCLI_NSQD_TCP_ADDRESS": f"{disk.tcp_address} {memory.tcp_address}",
           "NSQCLI_NSQD_HTTP_ADDRESS": f"{disk.http_address} {memory.http_address}"}
    r = run(["tail", topic, "-c", "billing", "--peek", "--max-in-flight", "4", "--timeout", "12s"], env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(set(lines))
    from_memory = [x for x in lines if x.startswith(memory.tcp_address.encode() + b"-")]
    assert len(from_memory) == 40, (len(from_memory), r.stderr)
    for node, n in ((disk, 60), (memory, 40)):
        wait_for(lambda: channel_stats(node, topic, "billing")["in_flight_count"] == 0, what="given back")
        ch = channel_stats(node, topic, "billing")
        assert ch["depth"] + ch["deferred_count"] == n and ch["message_count"] == n


def test_peek_says_so_when_a_node_did_not_answer_before_it_started(cluster, topic):
    # an nsqd hung while the peek asked every node its backlog: the peek went on with the other
    # node, showed its 5 messages and ended, exit 0, saying nothing of the 7 on the hung node
    from hung import stopped

    a, b = cluster.nsqds[:2]
    for node, n in ((a, 5), (b, 7)):
        http_post(node.http_address, "/topic/create", topic=topic)
        http_post(node.http_address, "/channel/create", topic=topic, channel="billing")
        http_post(node.http_address, "/mpub", b"\n".join(b"m%d" % i for i in range(n)), topic=topic)
    env = {"NSQCLI_NSQD_TCP_ADDRESS": f"{a.tcp_address} {b.tcp_address}",
           "NSQCLI_NSQD_HTTP_ADDRESS": f"{a.http_address} {b.http_address}"}
    with stopped(b):
        r = run(["tail", topic, "-c", "billing", "--peek", "--timeout", "10s"], env)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 5, r.stderr
    warned = [x for x in r.stderr.decode().splitlines() if "a backlog there is not counted" in x]
    assert len(warned) == 1 and b.http_address in warned[0], r.stderr
    for node, n in ((a, 5), (b, 7)):
        wait_for(lambda: channel_stats(node, topic, "billing")["in_flight_count"] == 0, what="given back")
        assert channel_stats(node, topic, "billing")["depth"] == n


def test_where_regex_escapes_a_python_user_types(nsqd, topic):
    # '.name =~ "^\d+$"' (as in Python or grep) was refused with only "bad escape in string": the
    # error now says how to write it, and the doubled escape matches with RE2
    from helpers import one_error_line

    r = run(["tail", topic, "--where", r'.n =~ "^\d+$"'], _env(nsqd))
    one_error_line(r, 2, r"bad escape in string .*a regular expression's \\d is written \\\\d")
    http_post(nsqd.http_address, "/topic/create", topic=topic)
    http_post(nsqd.http_address, "/channel/create", topic=topic, channel="billing")
    http_post(nsqd.http_address, "/mpub", b'{"n": "12a"}\n{"n": "123"}\n{"n": "\\u03b1\\u03b2"}\n{"n": "AbC"}',
              topic=topic)
    for where, want in ((r'.n =~ "^\\d+$"', b'{"n": "123"}'), (r'.n =~ "^\\p{Greek}+$"', b'{"n": "\\u03b1\\u03b2"}'),
                        ('.n =~ "(?i)^abc$"', b'{"n": "AbC"}')):
        r = run(["tail", topic, "-c", "billing", "--peek", "--where", where, "-n", "4", "--timeout", "10s"], _env(nsqd))
        assert r.returncode == 0 and r.stdout == want + b"\n", (where, r.stdout, r.stderr)


@pytest.mark.parametrize("found_by", ["addresses", "nsqlookupd"])
def test_peek_does_not_create_the_channel_on_a_node_that_lacks_it(cluster, topic, found_by):
    # the channel on node a only; b carries the topic (2 messages, no channel): the peek subscribed
    # to b too, which created a durable 'billing' there - it took b's topic backlog and keeps a
    # copy of every message published to b from then on
    from helpers import topic_stats

    a, b = cluster.nsqds[:2]
    for node in (a, b):
        http_post(node.http_address, "/topic/create", topic=topic)
    http_post(a.http_address, "/channel/create", topic=topic, channel="billing")
    http_post(a.http_address, "/mpub", b"1\n2\n3", topic=topic)
    http_post(b.http_address, "/mpub", b"x\ny", topic=topic)
    env = two_nodes_env(cluster, topic, found_by)
    r = run(["tail", topic, "-c", "billing", "--peek", "--timeout", "10s"], env)
    assert r.returncode == 0 and sorted(r.stdout.splitlines()) == [b"1", b"2", b"3"], (r.stdout, r.stderr)
    assert topic_stats(b, topic)["channels"] == [] and topic_stats(b, topic)["depth"] == 2
    wait_for(lambda: channel_stats(a, topic, "billing")["in_flight_count"] == 0, what="given back")
    assert channel_stats(a, topic, "billing")["depth"] == 3
