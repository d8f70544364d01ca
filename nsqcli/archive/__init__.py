"""Archives: file naming, the writer (records, gzip members, fsync, moves), crash recovery, the
to-file daemon, and a reader for archives."""
