"""Idempotent ingest: which (actor_id, epoch, seq) keys were already taken in.

Per (actor, epoch) a watermark below which every seq was seen, plus the seen seqs above it (a gap left by
a lost chunk keeps later seqs in the set until the resend fills it). The state is small and is written
into every compacted write-ahead log, so a restarted buffer still recognises resends.
"""
from __future__ import annotations


class SeqDeduper:
    def __init__(self) -> None:
        self._state: dict[tuple[str, int], tuple[int, set[int]]] = {}

    def seen(self, key: tuple[str, int], seq: int) -> bool:
        mark, above = self._state.get(key, (-1, ()))
        return seq <= mark or seq in above

    def add(self, key: tuple[str, int], seq: int) -> None:
        mark, above = self._state.get(key, (-1, None))
        if above is None:
            above = set()
        if seq == mark + 1 and not above:  # the common, in-order case
            self._state[key] = (seq, above)
            return
        above.add(seq)
        while mark + 1 in above:
            mark += 1
            above.discard(mark)
        self._state[key] = (mark, above)

    def snapshot(self) -> list:
        return [[actor, epoch, mark, sorted(above)] for (actor, epoch), (mark, above) in self._state.items()]

    @classmethod
    def restore(cls, rows: list) -> "SeqDeduper":
        d = cls()
        for actor, epoch, mark, above in rows:
            d._state[(str(actor), int(epoch))] = (int(mark), {int(s) for s in above})
        return d

    def __len__(self) -> int:
        return len(self._state)
