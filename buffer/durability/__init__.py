"""The buffer's durability: a write-ahead log file (wal.py), what the replay store's events become in it and
how a restart replays it (journal.py), in the on-disk records of records.py."""
