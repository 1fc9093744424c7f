"""A recorded Batch read back as episodes and turns: what each turn was given (its context) and what it sampled.

The buffer lays an item out turn by turn, [obs_0, gen_0, obs_1, gen_1, ...] (buffer/store/episodes.py flatten). A
trained turn's generated tokens are the ones in the action mask, so its observation is the rest of the turn. The
turns before an item's first trained turn (the context of a segment) are outside the mask and carry no versions:
they are given here as context only, and were recorded as trained turns in the step that served the earlier
segment.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from turnstream.protocol.messages import Batch


@dataclass(frozen=True)
class RecordedTurn:
    """One trained turn of an item: the request vLLM served and what it sampled."""

    episode_id: str
    turn: int
    context: np.ndarray  # the tokens the request gave vLLM: from the context's start through this turn's observation
    observation: np.ndarray  # this turn's observation, the end of `context`
    tokens: np.ndarray  # the sampled tokens (a segment's bootstrap turn: only its first)
    logprobs: np.ndarray  # their sampling log-probs
    versions: np.ndarray  # the weight version that sampled each
    temperature: float
    allowed: tuple[int, ...]  # empty: the whole vocabulary
    top_p: float
    top_k: int
    seed: int  # vLLM's sampling seed of the request; -1: unknown
    reward: float  # the reward after the turn
    complete: bool  # False: a segment's bootstrap turn, of which the batch holds the first token only
    gen_start: int  # where `tokens` sit in the batch's token arrays

    @property
    def positions(self) -> np.ndarray:
        return np.arange(self.gen_start, self.gen_start + self.tokens.size)

    def version_spans(self) -> list[tuple[int, int, int]]:
        """(version, start, end) runs of the tokens' versions: more than one when a push landed mid-turn."""
        spans: list[tuple[int, int, int]] = []
        for i, v in enumerate(self.versions.tolist()):
            if spans and spans[-1][0] == v:
                spans[-1] = (v, spans[-1][1], i + 1)
            else:
                spans.append((v, i, i + 1))
        return spans


@dataclass(frozen=True)
class RecordedItem:
    """One item of a batch: an episode, or a segment of an open one."""

    index: int
    episode_id: str
    prompt_key: str
    agent_id: int
    episode_return: float
    first_turn: int  # the turns before it are context
    bootstrap_turn: int  # -1: the item ends its episode
    truncated: bool
    start: int  # its tokens in the batch: [start, end)
    end: int
    rewards: np.ndarray  # the reward after each of the episode's turns, from turn 0
    turns: list[RecordedTurn]  # its trained turns, in order

    @property
    def action_tokens(self) -> int:
        return sum(t.tokens.size for t in self.turns)


def items(batch: Batch) -> list[RecordedItem]:
    """The batch's items in the order it holds (and the learner trained) them."""
    offsets = np.asarray(batch.episode_offsets)
    n = len(batch.episode_ids)
    per_item = {name: np.asarray(getattr(batch, name)) for name in ("agent_ids", "truncated", "first_turns",
                                                                     "bootstrap_turns")}
    has = {name: values.size == n for name, values in per_item.items()}
    turn_offsets = np.asarray(batch.turn_offsets)
    per_turn = turn_offsets.size == n + 1
    seeds = np.asarray(batch.turn_seeds)
    seeded = per_turn and seeds.size == turn_offsets[-1]
    restarts = np.asarray(batch.context_starts)
    out = []
    for e in range(n):
        start, end = int(offsets[e]), int(offsets[e + 1])
        rewards = np.asarray(batch.turn_rewards[turn_offsets[e]:turn_offsets[e + 1]]) if per_turn else np.zeros(0)
        turn_seeds = seeds[turn_offsets[e]:turn_offsets[e + 1]] if seeded else np.zeros(0, np.int64)
        item_restarts = restarts[(restarts > start) & (restarts < end)]
        out.append(RecordedItem(
            index=e, episode_id=batch.episode_ids[e], prompt_key=batch.prompt_keys[e],
            agent_id=int(per_item["agent_ids"][e]) if has["agent_ids"] else 0,
            episode_return=float(batch.returns[e]),
            first_turn=int(per_item["first_turns"][e]) if has["first_turns"] else 0,
            bootstrap_turn=int(per_item["bootstrap_turns"][e]) if has["bootstrap_turns"] else -1,
            truncated=bool(per_item["truncated"][e]) if has["truncated"] else False,
            start=start, end=end, rewards=rewards,
            turns=_turns(batch, e, start, end, item_restarts, rewards, turn_seeds)))
    return out


def _turns(batch: Batch, e: int, start: int, end: int, restarts: np.ndarray, rewards: np.ndarray,
           seeds: np.ndarray) -> list[RecordedTurn]:
    tokens = np.asarray(batch.tokens)
    action = np.asarray(batch.action_mask[start:end]).astype(bool)
    turn_of = np.asarray(batch.turn_index[start:end])
    bootstrap = int(batch.bootstrap_turns[e]) if np.asarray(batch.bootstrap_turns).size else -1
    truncation = np.asarray(batch.top_p).size == tokens.size
    out = []
    for t in np.unique(turn_of[action]).tolist():
        gen = start + np.flatnonzero(action & (turn_of == t))
        first, last = int(gen[0]), int(gen[-1]) + 1
        turn_begin = start + int(np.flatnonzero(turn_of == t)[0])
        context_begin = int(max([start, *restarts[restarts <= first].tolist()]))
        mask_id = int(batch.mask_id[first])
        out.append(RecordedTurn(
            episode_id=batch.episode_ids[e], turn=t, context=tokens[context_begin:first],
            observation=tokens[turn_begin:first], tokens=tokens[first:last],
            logprobs=np.asarray(batch.behav_logprobs[first:last]), versions=np.asarray(batch.versions[first:last]),
            temperature=float(batch.temperature[first]),
            allowed=tuple(batch.allowed_sets[mask_id]) if mask_id >= 0 else (),
            top_p=float(batch.top_p[first]) if truncation else 1.0,
            top_k=int(batch.top_k[first]) if truncation else 0,
            seed=int(seeds[t]) if t < seeds.size else -1,
            reward=float(rewards[t]) if t < rewards.size else 0.0,
            complete=t != bootstrap, gen_start=first))
    return out
