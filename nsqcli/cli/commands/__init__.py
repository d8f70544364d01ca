"""One thin module per nsqcli command: options, wiring and output. The shared machinery
(app, options, views, types, docs) is one level up, in nsqcli.cli."""
