"""Staleness-aware replay buffer role: ingest turn chunks, assemble episodes, serve batches."""
