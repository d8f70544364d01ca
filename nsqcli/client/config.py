"""Client configuration: frozen records (dataclass-like, see .record) with go-nsq's defaults (go-nsq config.go, v1.1.0)
unless a comment says why nsqcli differs."""

from __future__ import annotations

import socket

from ..version import __version__
from .record import Record, field


class TLSConfig(Record, frozen=True):
    """TLS for nsqd connections. Certificates and hostname are verified unless
    ``insecure_skip_verify`` is set explicitly."""

    enabled: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    min_version: str | None = None          # "1.0" | "1.1" | "1.2" | "1.3" (go-nsq: tls_min_version)
    insecure_skip_verify: bool = False
    server_hostname: str | None = None      # default: the host part of the nsqd address


#: nsqd's default --max-output-buffer-size; asked for by consumers with enough in flight to fill it
BIG_OUTPUT_BUFFER = 64 * 1024
#: ~BIG_OUTPUT_BUFFER / (100-byte messages + 34 bytes of framing)
BIG_BUFFER_RDY = 500


class Config(Record, frozen=True):
    # -- connection (go-nsq: dial_timeout 1s, read_timeout 60s, write_timeout 1s) ---------------
    dial_timeout: float = 1.0
    handshake_timeout: float = 5.0          # IDENTIFY .. SUB's OK, in total (go-nsq: per read)
    read_timeout: float = 60.0
    write_timeout: float = 10.0             # go-nsq 1s; 10s tolerates a loaded loopback nsqd
    heartbeat_interval: float = 30.0        # go-nsq 30s; <= 0 disables
    # go-nsq 16384. None: nsqd's default (16 KiB), except with max_in_flight >= BIG_BUFFER_RDY
    # (a consumer's setting; a Producer given such a Config asks too, harmlessly): 64 KiB, nsqd's
    # default maximum. An nsqd started with a lower --max-output-buffer-size refuses it; the
    # connection is then dialled again without it (each time: two dials, and two ERROR lines in
    # that nsqd's log - set output_buffer_size to its maximum to avoid them). nsqd
    # then writes 4x fewer, bigger chunks: measured 8-10% less consumer CPU at 1M x 100 B, and
    # fewer context switches on both sides. It adds nothing to latency: a partial buffer is sent
    # after output_buffer_timeout whatever its size.
    output_buffer_size: int | None = None
    # go-nsq 250ms. nsqd holds a partial output buffer up to this long before sending it: with
    # 250 ms a `tail` shows a lone message a quarter second late, and a consumer starting at
    # RDY 1 waits that long for its first message. At high rates the 16 KiB buffer fills first,
    # so 50 ms costs nsqd nothing there and at most 20 small flushes/s per idle-ish client.
    output_buffer_timeout: float | None = 0.05
    msg_timeout: float | None = None        # None = nsqd's --msg-timeout (60s)
    sample_rate: int = 0                    # 0 = off, 1..99 = percent of messages delivered
    client_id: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    hostname: str = field(default_factory=socket.gethostname)
    user_agent: str = f"nsqcli/{__version__}"
    tls: TLSConfig = TLSConfig()
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6                  # 1..9; nsqd caps at its --max-deflate-level
    auth_secret: str | None = None
    max_frame_size: int = 64 * 1024 * 1024  # refuse bigger frames before allocating
    #: called with a sentence about the connection worth telling a person (e.g. an AUTH secret
    #: given to an nsqd that does not use AUTH); None = say nothing
    on_notice: object = field(default=None, compare=False, repr=False)

    # -- consumer -------------------------------------------------------------------------------
    max_in_flight: int = 1                  # go-nsq 1; commands set their own
    # nsqcli only: RDY shrinks so that (average message size x RDY) stays within this many
    # bytes (never below RDY 1); 0 = no byte budget. Big messages cannot fill memory at RDY 200.
    max_in_flight_bytes: int = 64 * 1024 * 1024
    max_attempts: int = 5                   # 0 = unlimited
    default_requeue_delay: float = 90.0     # x attempts
    max_requeue_delay: float = 15 * 60.0
    backoff_strategy: str = "exponential"   # or "full_jitter"
    backoff_multiplier: float = 1.0
    max_backoff_duration: float = 120.0     # 0 disables backoff
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    lookupd_poll_timeout: float = 5.0       # go-nsq 60s; a down lookupd must not stall discovery
    reconnect_min_delay: float = 1.0        # go-nsq: fixed 60s; nsqcli: 1s, 2s, 4s ... + jitter
    # 4s: a node back after an outage is read within seconds; a refused dial
    # every ~4 s costs nothing. Also caps the quick lookupd re-polls after a lookupd-found loss.
    reconnect_max_delay: float = 4.0
    concurrency: int = 1                    # handler threads
    touch_interval: float = 0.0             # pull mode: TOUCH held messages this often (0 = never)

    # -- producer -------------------------------------------------------------------------------
    max_body_size: int = 5 * 1024 * 1024    # nsqd --max-body-size default; MPUB batches stay below
    max_msg_size: int = 1024 * 1024         # nsqd --max-msg-size default

    def identify(self) -> dict:
        """The IDENTIFY body (feature negotiation on)."""
        ms = lambda s: int(s * 1000)  # noqa: E731
        body = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": ms(self.heartbeat_interval) if self.heartbeat_interval > 0 else -1,
            "tls_v1": self.tls.enabled,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
        }
        size = self.output_buffer_size
        if size is None and self.max_in_flight >= BIG_BUFFER_RDY:
            size = BIG_OUTPUT_BUFFER
        if size is not None:
            body["output_buffer_size"] = size
        if self.output_buffer_timeout is not None:
            body["output_buffer_timeout"] = ms(self.output_buffer_timeout)
        if self.msg_timeout is not None:
            body["msg_timeout"] = ms(self.msg_timeout)
        return body

