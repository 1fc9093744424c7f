"""Assembling turn chunks into episodes and flattening episodes into a learner batch."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from turnstream.protocol.messages import Batch, TurnChunk


@dataclass
class Episode:
    episode_id: str
    actor_key: tuple[str, int]  # (actor_id, epoch)
    prompt_key: str
    turns: dict[int, TurnChunk] = field(default_factory=dict)
    last_turn: int | None = None  # index of the turn that carried done=True
    last_seen: float = field(default_factory=time.monotonic)
    # kept up to date by add(), so staleness checks and token budgets cost O(1) per episode
    num_tokens: int = 0
    min_version: int = 2**31 - 1
    nbytes: int = 0

    def add(self, chunk: TurnChunk) -> None:
        self.turns[chunk.turn] = chunk
        self.last_seen = time.monotonic()
        self.num_tokens += chunk.obs_tokens.size + chunk.gen_tokens.size
        self.nbytes += chunk.obs_tokens.nbytes + chunk.gen_tokens.nbytes * 3 + chunk.allowed_tokens.nbytes
        if chunk.gen_versions.size:
            self.min_version = min(self.min_version, int(chunk.gen_versions.min()))
        if chunk.done:
            self.last_turn = chunk.turn

    def beyond_final_turn(self, chunk: TurnChunk) -> bool:
        """A turn after the one marked done, or a done marker before turns already received."""
        if self.last_turn is not None and chunk.turn > self.last_turn:
            return True
        return chunk.done and any(t > chunk.turn for t in self.turns)

    @property
    def complete(self) -> bool:
        return self.last_turn is not None and len(self.turns) == self.last_turn + 1 and all(
            t in self.turns for t in range(self.last_turn + 1))

    @property
    def behaviour_version(self) -> int:
        """The oldest version that produced a token of this episode (0 if nothing was generated)."""
        return self.min_version if self.min_version != 2**31 - 1 else 0

    @property
    def episode_return(self) -> float:
        return float(sum(c.reward for c in self.turns.values()))


def flatten(episodes: list[Episode], request_id: int, learner_version: int, dropped_stale: int) -> Batch:
    """Concatenate episodes turn by turn: [obs_0, gen_0, obs_1, gen_1, ...] per episode."""
    cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                         ("tokens", "action", "logp", "ver", "turn", "temp", "mask")}
    allowed_sets: list[list[int]] = []
    set_index: dict[tuple[int, ...], int] = {}
    offsets = [0]
    for ep in episodes:
        for t in range(ep.last_turn + 1):  # type: ignore[operator]
            c = ep.turns[t]
            n_obs, n_gen = c.obs_tokens.size, c.gen_tokens.size
            mask_id = -1
            if c.allowed_tokens.size:
                key = tuple(int(x) for x in c.allowed_tokens)
                mask_id = set_index.setdefault(key, len(set_index))
                if mask_id == len(allowed_sets):
                    allowed_sets.append(list(key))
            cols["tokens"] += [c.obs_tokens, c.gen_tokens]
            cols["action"] += [np.zeros(n_obs, np.uint8), np.ones(n_gen, np.uint8)]
            cols["logp"] += [np.zeros(n_obs, np.float32), c.gen_logprobs]
            cols["ver"] += [np.full(n_obs, -1, np.int32), c.gen_versions]
            cols["turn"].append(np.full(n_obs + n_gen, t, np.int32))
            cols["temp"].append(np.full(n_obs + n_gen, c.temperature, np.float32))
            cols["mask"].append(np.full(n_obs + n_gen, mask_id, np.int32))
        offsets.append(offsets[-1] + ep.num_tokens)
    turns = [[ep.turns[t] for t in range(ep.last_turn + 1)] for ep in episodes]  # type: ignore[operator]
    # Token ids come as uint32 (protocol/SCHEMA.md); the batch carries int32: an id of 2**31 or more turns
    # negative, and the learner drops its episode as outside the vocabulary.
    cat = {k: (np.concatenate(v, dtype=np.int32 if k == "tokens" else None, casting="unsafe") if v
               else np.zeros(0)) for k, v in cols.items()}
    return Batch(
        request_id=request_id, learner_version=learner_version,
        episode_ids=[e.episode_id for e in episodes], prompt_keys=[e.prompt_key for e in episodes],
        returns=[e.episode_return for e in episodes],
        tokens=cat["tokens"], action_mask=cat["action"], behav_logprobs=cat["logp"], versions=cat["ver"],
        turn_index=cat["turn"], temperature=cat["temp"], mask_id=cat["mask"],
        episode_offsets=np.asarray(offsets, np.int64), allowed_sets=allowed_sets, dropped_stale=dropped_stale,
        agent_ids=np.array([t[0].agent_id for t in turns], np.int32),
        truncated=np.array([t[-1].truncated for t in turns], bool),
        turn_rewards=np.array([c.reward for t in turns for c in t], np.float32),
        turn_offsets=np.cumsum([0, *(len(t) for t in turns)], dtype=np.int64),
    )
