"""Staleness-aware replay buffer role: ingest turn chunks, assemble episodes, serve batches.

Where things live:
- main.py (the process), server.py (the sockets: chunks and acks in and out, batch requests, version
  announcements), acks.py (delayed, grouped acks), metrics.py;
- store/ (the domain: the replay store, episodes, admission, rate limits, sampling, and the events it emits);
- the store's listeners: durability/ (the write-ahead log, replayed on restart), store_metrics.py (the
  metrics), audit.py (the audit trail, with TURNSTREAM_AUDIT=1).
"""
