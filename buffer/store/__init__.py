"""The replay store, the buffer's domain: chunks in, episodes assembled, batches out, within the bounds.

replay_store.py (ReplayStore: ingest, assembly, serving, expiry, snapshot), episodes.py (an episode and its
segments), validate.py and dedup.py (what a chunk must be, and which were taken in), admission.py (AReaL's
capacity rule and credits), ratelimit.py (samples per insert), sampling.py (which episodes make a batch),
events.py (what the store tells its listeners: the one seam to the journal, metrics and audit).
"""
