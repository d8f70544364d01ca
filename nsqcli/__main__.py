"""``python -m nsqcli``: the same entry as the ``nsqcli`` console script (nsqcli.entry: signals
first, the `pub` fast path, else the click app)."""

from nsqcli.entry import main

if __name__ == "__main__":
    main()
