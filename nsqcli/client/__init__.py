"""The threaded client core: transport, connection, consumer, producer, flow control, config,
nsqlookupd/nsqd HTTP."""
