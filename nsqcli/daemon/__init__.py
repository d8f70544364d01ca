"""Daemon features of the long-running commands (to-file, to-nsq, to-http, tail), click-free:
systemd notification (sdnotify), and what the run harness (nsqcli/cli/harness.py) calls into.
May import nsqcli.client, protocol, errors, version, clock - never nsqcli.cli."""
