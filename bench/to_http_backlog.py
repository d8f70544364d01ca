"""nsqcli to-http vs the official nsq_to_http against a server that closes after each answer:
Python's single-threaded ``http.server.HTTPServer`` (HTTP/1.0, listen backlog 5), same run.

    .venv/bin/python -m bench.to_http_backlog --messages 3000              # speed, both tools
    .venv/bin/python -m bench.to_http_backlog --messages 3000 --faults     # + duplicates under faults
    .venv/bin/python -m bench.to_http_backlog --keep-alive                 # a ThreadingHTTPServer, HTTP/1.1
    .venv/bin/python -m bench.to_http_backlog --toxiproxy 16               # toxiproxy faults, 16 s each

Each contender gets its own topic of N distinct bodies and its own receiver; msg/s is counted
until the receiver holds every body, with the listen overflows (nstat TcpExtListenOverflows)
of that window. ``--faults`` replays one fault schedule on the receiver (counted by request
number, so both tools meet the same faults): resets after the body was taken (the answer is
lost: a duplicate is unavoidable), resets before the body was read (a retry is no duplicate),
slow closes (the answer, then 0.3 s before the close; the answer has a Content-Length), and a
blackhole (the server stops for 3 s while requests queue). A failed message is requeued after
1 s in both (nsq_to_http --consumer-opt=default_requeue_delay,1s, nsqcli --requeue-delay 1s):
with the default 90 s the run is the requeue delay's length. Reported: bodies received 2+ and
3+ times.

``--toxiproxy SECONDS``: a real toxiproxy-server (.nsq/bin, scripts/install-toxiproxy) between
the tool and the receiver, and a fixed-length run of each tool on a topic it cannot finish, with
one fault timeline from its start: 5 reset_peer (t = 2..6 s), a blackhole (timeout toxic, 8-10
s), slow_close 500 ms (11-14 s); --http-timeout 5s (nsq_to_http
--http-client-request-timeout=5s) so what the blackhole held fails within the run. Reported:
bodies received, and those received 2+ / 3+ times.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from nsqcli import Config, Producer
from nsqcli.sandbox import Sandbox, find_binary


def _receiver(port_q, got, stop, faults: bool, keep_alive: bool, backlog: int, out_q) -> None:
    from collections import Counter
    from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer

    counts: Counter = Counter()
    seen = [0]  # requests begun (the fault schedule's clock)
    lost = [0]  # bodies taken whose answer the reset lost: a duplicate each is unavoidable

    def reset(sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_POST(self):
            seen[0] += 1
            i = seen[0]
            fault = None
            if faults:
                # per 400 requests: 5 resets after the body, 5 before it, 3 slow closes, and a
                # 3 s stop once (request 1500)
                k = i % 400
                fault = ("reset_after" if k in (11, 91, 171, 251, 331) else
                         "reset_before" if k in (51, 131, 211, 291, 371) else
                         "slow_close" if k in (31, 151, 271) else None)
                if i == 1500:
                    time.sleep(3.0)
            if fault == "reset_before":
                reset(self.connection)
                self.close_connection = True
                self.rfile.close()
                self.connection.close()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            counts[body] += 1
            with got.get_lock():
                got.value = len(counts)
            if fault == "reset_after":
                lost[0] += 1
                reset(self.connection)
                self.close_connection = True
                self.connection.close()
                return
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            if fault == "slow_close":
                self.wfile.flush()
                time.sleep(0.3)

        def log_message(self, *a):
            pass

    base = ThreadingHTTPServer if keep_alive else HTTPServer

    class S(base):
        request_queue_size = backlog
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass

    srv = S(("127.0.0.1", 0), H)
    srv.timeout = 0.2
    port_q.put(srv.server_address[1])
    while not stop.is_set():
        srv.handle_request()
    out_q.put((dict(counts), lost[0]))


def overflows() -> int:
    out = subprocess.run(["nstat", "-az", "TcpExtListenOverflows"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("TcpExtListenOverflows"):
            return int(line.split()[1])
    return 0


def run_one(name: str, src, topic: str, n: int, faults: bool, keep_alive: bool, backlog: int,
            concurrency: int, toxi=None, run_for: float = 0.0) -> dict:
    ctx = mp.get_context("fork")
    port_q, out_q, got, stop = ctx.Queue(), ctx.Queue(), ctx.Value("i", 0), ctx.Event()
    rx = ctx.Process(target=_receiver, args=(port_q, got, stop, faults, keep_alive, backlog, out_q), daemon=True)
    rx.start()
    port = port_q.get(timeout=10)
    proxy = None
    if toxi is not None:
        proxy = toxi.proxy(f"127.0.0.1:{port}")
        url = f"http://{proxy.listen}/ingest"
    else:
        url = f"http://127.0.0.1:{port}/ingest"
    a = src.nsqd.tcp_address
    slow = faults or toxi is not None
    if name == "nsq_to_http":
        cmd = [find_binary("nsq_to_http"), "--topic", topic, "--nsqd-tcp-address", a, "--post", url,
               "-n", str(concurrency)] + (["--consumer-opt=default_requeue_delay,1s"] if slow else [])
        if toxi is not None:
            cmd.append("--http-client-request-timeout=5s")
    else:
        cmd = [sys.executable, "-m", "nsqcli", "to-http", "-t", topic, "--nsqd-tcp-address", a, "--post", url,
               "--concurrency", str(concurrency), "--no-live"] + (["--requeue-delay", "1s"] if slow else [])
        if toxi is not None:
            cmd += ["--http-timeout", "5s"]
    log = tempfile.TemporaryFile()
    o0 = overflows()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    timed_out = False
    if proxy is not None:
        _fault_timeline(proxy, t0, run_for)
        n = 0
    while got.value < n:
        if p.poll() is not None:
            log.seek(0)
            raise SystemExit(f"{name} exited early: {log.read()[-500:]!r}")
        if time.perf_counter() - t0 > 300:
            timed_out = True
            break
        time.sleep(0.005)
    elapsed = time.perf_counter() - t0
    o1 = overflows()
    time.sleep(1.0 if slow else 0.0)  # what was still under way lands (a late duplicate counts)
    p.send_signal(signal.SIGTERM)
    p.wait(60)
    stop.set()
    counts, lost = out_q.get(timeout=10)
    rx.join(5)
    if proxy is not None:
        proxy.delete()
    twice = sum(1 for c in counts.values() if c == 2)
    more = sum(1 for c in counts.values() if c >= 3)
    return {"rate": got.value / elapsed, "elapsed": elapsed, "overflows": o1 - o0, "received": len(counts),
            "twice": twice, "thrice+": more, "timed_out": timed_out, "lost": lost}


def _fault_timeline(proxy, t0: float, run_for: float) -> None:
    """The toxiproxy faults, by seconds from the tool's start (see the module's doc)."""

    def at(t: float) -> None:
        time.sleep(max(0.0, t0 + t - time.perf_counter()))

    for t in (2, 3, 4, 5, 6):
        at(t)
        name = proxy.add("reset_peer", timeout=0)
        time.sleep(0.05)
        proxy.remove(name)
    at(8)
    with proxy.toxic("timeout", timeout=0):
        at(10)
    at(11)
    with proxy.toxic("slow_close", delay=500):
        at(14)
    at(run_for)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=100, help="nsq_to_http -n / nsqcli --concurrency")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--backlog", type=int, default=5, help="the receiver's listen backlog (request_queue_size)")
    ap.add_argument("--faults", action="store_true", help="resets, slow closes and a 3 s stop (duplicates)")
    ap.add_argument("--keep-alive", action="store_true", help="a ThreadingHTTPServer speaking HTTP/1.1 instead")
    ap.add_argument("--only", choices=["nsqcli", "go"], help="run one contender")
    ap.add_argument("--toxiproxy", type=float, metavar="SECONDS", default=0.0,
                    help="each tool for this long through toxiproxy's fault timeline (at least 15)")
    args = ap.parse_args()
    toxi = None
    if args.toxiproxy:
        import contextlib
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from toxiproxy import Toxiproxy

        args.toxiproxy = max(15.0, args.toxiproxy)
        toxi = Toxiproxy.start(Path(tempfile.mkdtemp(prefix="bench-toxiproxy-")))
    names = ["nsqcli to-http", "nsq_to_http"]
    if args.only:
        names = [names[0] if args.only == "nsqcli" else names[1]]
    kind = ("ThreadingHTTPServer HTTP/1.1 keep-alive" if args.keep_alive else
            f"HTTPServer HTTP/1.0 (closes after each answer), backlog {args.backlog}")
    with Sandbox(with_lookupd=False) as src:
        rates: dict[str, list[float]] = {k: [] for k in names}
        for r in range(args.rounds):
            for name in names:
                topic = f"bk{r}_{name.split()[-1].replace('-', '_')}"
                with Producer(src.nsqd.tcp_address, Config()) as pr:
                    pr.multi_publish(topic, [b"m%07d" % i for i in range(args.messages)], batch_size=500)
                res = run_one(name, src, topic, args.messages, args.faults, args.keep_alive, args.backlog,
                              args.concurrency, toxi, args.toxiproxy)
                rates[name].append(res["rate"])
                print(f"round {r + 1}: {name:15s} {res['rate']:>8,.0f} msg/s  {res['elapsed']:6.1f} s  "
                      f"listen overflows {res['overflows']:>6,}  received {res['received']:,}"
                      + (f"  twice {res['twice']}  3+ times {res['thrice+']}" if args.faults or toxi else "")
                      + (f" (answers lost after the body was taken: {res['lost']})" if args.faults else "")
                      + ("  (NOT DONE in 300 s)" if res["timed_out"] else ""), flush=True)
        if len(names) == 2:
            import statistics

            med = {k: statistics.median(v) for k, v in rates.items()}
            print(f"\nmedian of {args.rounds}: nsqcli to-http {med[names[0]]:,.0f} msg/s, nsq_to_http "
                  f"{med[names[1]]:,.0f} msg/s = {med[names[0]] / med[names[1]]:.2f}x ({args.messages:,} POSTs to "
                  f"{kind}, concurrency {args.concurrency}{', with faults' if args.faults else ''}, same run)")
    if toxi is not None:
        with contextlib.suppress(Exception):
            toxi.stop()


if __name__ == "__main__":
    main()
