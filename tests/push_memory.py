"""How many bytes of a push's full tensors are alive at once while the disk backend writes it, bucket by bucket:
weak references to every tensor a bucket brought, counted (after a collection) each time a new one arrives."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path


def peak_bytes_held(source, directory: Path) -> int:
    """Write `source` (a WeightBuckets) into `directory` as the disk backend does; the peak of bytes held."""
    from turnstream.learner.weights.files import write_shards

    alive: list[weakref.ref] = []
    peak = 0

    def watched():
        nonlocal peak
        for bucket in source:
            gc.collect()
            alive[:] = [r for r in alive if r() is not None]
            alive.extend(weakref.ref(t) for _, t in bucket)
            peak = max(peak, sum(t.numel() * t.element_size() for t in (r() for r in alive) if t is not None))
            yield bucket
            del bucket  # as write_shards drops its own before the next bucket is gathered

    directory.mkdir(parents=True)
    write_shards(directory, watched(), len(source.buckets))
    return peak
