"""Archives: file naming, the writer (records, gzip members, fsync, moves), crash recovery, the
to-file daemon, record formats, and a reader for archives."""
