"""``python -m nsqcli``.

The signal handling is installed before anything heavy is imported (click, rich, the client
core take ~0.1 s): a SIGINT/SIGTERM in that time exits at once with the documented code
(130 / 143) and one line, instead of a KeyboardInterrupt traceback or a bare death by signal.
Commands later install their own handling (a clean stop, see nsqcli.cli.app)."""

import os
import signal


def _early_exit(signum, frame):
    name = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}.get(signum, str(signum))
    try:
        os.write(2, f"nsqcli: interrupted ({name})\n".encode())
    finally:
        os._exit(128 + signum)


_early_exit.nsqcli_early = True  # nsqcli.cli.app.run recognises (and replaces) it


def install_early_signals() -> None:
    """SIGINT/SIGTERM exit cleanly from here on (a signal a parent made us ignore stays
    ignored); then unblock them, in case a parent blocked them across exec."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _early_exit)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


if __name__ == "__main__":
    install_early_signals()
    from nsqcli.cli import main

    main()
