"""``python -m nsqcli``. Importing nsqcli.cli installs the signal handling first thing, before
click and the rest are imported (see nsqcli.cli.install_early_signals)."""

from nsqcli.cli import main

if __name__ == "__main__":
    main()
