"""What `turnstream bench chaos` concludes from a run's audit trail (core/audit.py) and the buffer's log.

Every episode with an acked chunk must end up trained, still held in the buffer's write-ahead log, dropped
for a counted reason, or in a batch lost in a documented crash window: the batch a killed learner was given
after its last trained step (up to its successor's first), or the last batch a killed buffer served. What
is none of these is `acked_lost`. An episode in two learner steps is `trained_twice`; a step whose
staleness exceeds `buffer.max_staleness` a staleness violation.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from turnstream.core.config import Config
from turnstream.core.config_buffer import BufferSection


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


@dataclass
class AuditTrail:
    acked: set = field(default_factory=set)  # episodes with at least one ok-acked chunk
    served: list = field(default_factory=list)  # [(buffer incarnation, episode ids)] in serving order
    buffer_starts: int = 0
    dropped: set = field(default_factory=set)
    steps: list = field(default_factory=list)  # [(learner incarnation, step record)]

    @classmethod
    def read(cls, run_dir: Path) -> "AuditTrail":
        trail = cls()
        incarnation = -1
        for rec in _records(run_dir / "audit" / "learner.jsonl"):
            incarnation += "start" in rec
            if "episodes" in rec:
                trail.steps.append((incarnation, rec))
        for rec in _records(run_dir / "audit" / "buffer.jsonl"):
            if "start" in rec:
                trail.buffer_starts += 1
            elif rec.get("ack") == "ok":
                trail.acked.add(rec["ep"])
            elif "served" in rec:
                trail.served.append((trail.buffer_starts - 1, rec["served"]))
            elif "dropped" in rec:
                trail.dropped.update(rec["dropped"])
        return trail

    def trained(self) -> Counter:
        return Counter(ep for _, rec in self.steps for ep in rec["episodes"])

    def lost_in_crash_windows(self) -> set[str]:
        """Episodes of served batches never trained that a learner or buffer kill explains."""
        trained = set(self.trained())
        served_at = {ep: pos for pos, (_, eps) in enumerate(self.served) for ep in eps}
        # a learner incarnation followed by another was killed: positions served after its last step's batch
        # and before its successor's first one went to the dead process
        windows = []
        incarnations = sorted({inc for inc, _ in self.steps})
        for inc, nxt in zip(incarnations, incarnations[1:]):
            last = max(served_at.get(ep, -1) for i, rec in self.steps if i == inc for ep in rec["episodes"])
            first = min(served_at.get(ep, len(self.served)) for i, rec in self.steps if i == nxt
                        for ep in rec["episodes"])
            windows.append((last, first))
        killed_buffer_last = {max(pos for pos, (b, _) in enumerate(self.served) if b == inc)
                              for inc in {b for b, _ in self.served} if inc < self.buffer_starts - 1}
        lost = set()
        for pos, (_, eps) in enumerate(self.served):
            if trained & set(eps):
                continue
            if pos in killed_buffer_last or any(lo < pos < hi for lo, hi in windows):
                lost.update(eps)
        return lost


def held_in_log(wal: Path, b: BufferSection, scratch: Path) -> dict[str, set[int]]:
    """Replay a copy of a stopped buffer's write-ahead log `wal` (the run's [buffer] settings `b`): episode ->
    turns it still holds; empty when there is no log."""
    from turnstream.buffer.durability.journal import WalJournal
    from turnstream.buffer.durability.wal import WalFile
    from turnstream.buffer.metrics import BufferMetrics
    from turnstream.buffer.store.replay_store import ReplayStore

    if not wal.exists():
        return {}
    scratch.mkdir(parents=True, exist_ok=True)
    copy = Path(shutil.copy(wal, scratch / "wal.log"))
    store = ReplayStore(batch_episodes=b.batch_episodes, eta=b.eta, max_staleness=b.max_staleness,
                        max_running=b.max_running, max_items=b.max_items, episode_timeout_s=b.episode_timeout_s,
                        actor_timeout_s=b.actor_timeout_s)
    WalJournal(WalFile(copy), BufferMetrics(), compact_bytes=b.wal_compact_bytes).replay(store)
    return {ep_id: set(ep.turns) for ep_id, ep in [*store.ready.items(), *store.in_progress.items()]}


def account(cfg: Config, scratch: Path) -> dict:
    """The checks of the chaos benchmark's JSON line (after every role has stopped)."""
    trail = AuditTrail.read(Path(cfg.run.run_dir))
    trained = trail.trained()
    crash = trail.lost_in_crash_windows()
    b = cfg.buffer
    held = set(held_in_log((Path(b.wal_dir) if b.wal_dir else Path(cfg.run.run_dir) / "buffer-wal") / "wal.log", b,
                           scratch))
    lost = trail.acked - set(trained) - held - trail.dropped - crash
    return {"acked_episodes": len(trail.acked), "acked_lost": len(lost),
            "trained_twice": sum(1 for n in trained.values() if n > 1),
            "staleness_violations": sum(1 for _, rec in trail.steps
                                        if rec["staleness_max"] > cfg.buffer.max_staleness),
            "lost_in_crash_windows": len(crash), "held_in_log": len(held), "dropped": len(trail.dropped)}
