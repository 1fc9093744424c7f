"""Joins the buffer's and the learner's audit lines (core/audit.py) into the fault suite's checks.

buffer.jsonl: {"start"} per buffer process, {"ack": ok|duplicate, "key": [actor, epoch, seq], "ep", "turn",
"done", "tokens"} per acked chunk, {"served": [ids]} per batch, {"dropped": [ids], "reason"}.
learner.jsonl: {"start"} per learner process, then per trained batch {"version", "batch_version",
"episodes", "tokens", "staleness_max"}.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path


def read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.endswith("}"):  # a line being written right now is skipped, not misread
            out.append(json.loads(line))
    return out


@dataclass
class Ledger:
    ok_acks: Counter = field(default_factory=Counter)  # chunk key -> "ok" acks (must stay <= 1)
    chunks: dict = field(default_factory=lambda: defaultdict(dict))  # episode -> {turn: (key, done, tokens)}
    served: list = field(default_factory=list)  # (buffer incarnation, position, [episode ids])
    buffer_ends: list = field(default_factory=list)  # position of the last served record of each incarnation
    dropped: dict = field(default_factory=dict)  # episode -> reason
    steps: list = field(default_factory=list)  # (learner incarnation, record)

    @classmethod
    def read(cls, run_dir: Path, buffer_run_dir: Path | None = None) -> "Ledger":
        """`buffer_run_dir`: the buffer's run directory where it is not the learner's (roles on other hosts)."""
        led = cls()
        # The learner's file first: a trained line is written after the ack and served lines of its episodes,
        # so every episode it names is complete in the buffer's file read next. The other order, against a
        # running stack, could see a step whose chunks were acked after the buffer's file was read.
        incarnation = -1
        for rec in read_lines(run_dir / "audit" / "learner.jsonl"):
            if "start" in rec:
                incarnation += 1
            else:
                led.steps.append((incarnation, rec))
        incarnation, last_served = -1, None
        for rec in read_lines((buffer_run_dir or run_dir) / "audit" / "buffer.jsonl"):
            if "start" in rec:
                if last_served is not None:
                    led.buffer_ends.append(last_served)
                incarnation, last_served = incarnation + 1, None
            elif "ack" in rec:
                key = tuple(rec["key"])
                led.ok_acks[key] += rec["ack"] == "ok"
                led.chunks[rec["ep"]][rec["turn"]] = (key, rec["done"], rec["tokens"])
            elif "served" in rec:
                last_served = len(led.served)
                led.served.append((incarnation, last_served, rec["served"]))
            elif "dropped" in rec:
                for ep in rec["dropped"]:
                    led.dropped[ep] = rec["reason"]
        return led

    # ---- what was trained ----------------------------------------------------------------------
    def trained_counts(self) -> Counter:
        """Episode -> how many steps of any learner process trained on it."""
        return Counter(ep for _, rec in self.steps for ep in rec["episodes"])

    def resumed_versions(self) -> dict[int, int]:
        """Learner incarnation k > 0 -> the version it resumed at (its first step is that version + 1)."""
        out = {}
        for inc, rec in self.steps:
            if inc > 0 and inc not in out:
                out[inc] = rec["version"] - 1
        return out

    def undone_by_learner_crash(self) -> set[str]:
        """Episodes trained by a learner process that was then killed, in steps after the checkpoint that
        the next process resumed from: their update was lost with the process (at-most-once training)."""
        resumed = self.resumed_versions()
        return {ep for inc, rec in self.steps if inc + 1 in resumed and rec["version"] > resumed[inc + 1]
                for ep in rec["episodes"]}

    # ---- the checks ----------------------------------------------------------------------------
    def double_ingested(self) -> list:
        return [k for k, n in self.ok_acks.items() if n > 1]

    def trained_twice(self) -> list:
        return [ep for ep, n in self.trained_counts().items() if n > 1]

    def malformed_trained(self) -> list:
        """Trained episodes that are not exactly their acked chunks: turns 0..k, done only on the last, and
        as many tokens as the acked chunks hold."""
        bad = []
        for _, rec in self.steps:
            for ep, tokens in zip(rec["episodes"], rec["tokens"]):
                turns = self.chunks.get(ep, {})
                done = [t for t, (_, d, _) in turns.items() if d]
                if (sorted(turns) != list(range(len(turns))) or done != [len(turns) - 1]
                        or sum(n for _, _, n in turns.values()) != tokens):
                    bad.append(ep)
        return bad

    def check_accounted(self, held: dict[str, set[int]], in_flight: set[str] = frozenset()) -> None:
        """Every acked chunk is somewhere: trained, held in the stopped buffer's log (`held`, held_in_log), in
        an episode dropped for a recorded reason, or in a batch lost in a crash window (`in_flight`); and no
        trained episode is still in the log, to be served again."""
        trained = set(self.trained_counts())
        assert not set(held) & trained, "a trained episode is still in the log, to be served again"
        for ep, turns in held.items():  # every acked chunk of a held episode is in the log
            assert set(self.chunks.get(ep, {})) <= turns, ep
        accounted = trained | set(held) | set(self.dropped) | in_flight
        lost = sorted(ep for ep in self.chunks if ep not in accounted)
        assert lost == [], f"{len(lost)} episodes with acked chunks are nowhere: {lost[:5]}"

    def untrained_served(self, trained: set[str]) -> list:
        """Served records none of whose episodes any learner trained (a batch lost on its way)."""
        return [(inc, pos, eps) for inc, pos, eps in self.served if not trained & set(eps)]

    def position_of(self, episode: str) -> int:
        return next(pos for _, pos, eps in reversed(self.served) if episode in eps)

    def excused(self, record: tuple, killed_learners: int) -> bool:
        """A served batch that never got trained is excused only where the protocol allows it:
        - the last batch of a buffer process that was killed (logged as consumed before it left), or
        - a batch served to a learner process that was then killed: between the batch of its last step and
          the first batch of the process that replaced it (at most the batch in flight at the kill and the
          answer to the dead process's pending request)."""
        _, pos, _ = record
        if pos in self.buffer_ends:
            return True
        for inc in range(killed_learners):
            before = [rec for i, rec in self.steps if i == inc]
            after = [rec for i, rec in self.steps if i == inc + 1]
            if before and after:
                lo, hi = self.position_of(before[-1]["episodes"][0]), self.position_of(after[0]["episodes"][0])
                if lo < pos < hi:
                    return True
        return False
