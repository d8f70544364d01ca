"""What the tests share: real-server fixtures' helpers, fakes for what real servers cannot do on cue."""
