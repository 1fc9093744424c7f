"""Split a batch's episodes into micro-batches under a token budget, for gradient accumulation.

Packed (learner.pack_sequences, the default): a micro-batch is one row holding its episodes back to back,
position ids restarting at 0 for each (learner/batch/forward.py); it costs the sum of their lengths, so memory
is bounded by the budget, not by the longest episode, and nothing is spent on padding. Episodes are
placed first-fit by decreasing length. Padded: rows x longest episode within the budget; episodes are
sorted by length so that each micro-batch pads to a similar width.

The loss uses batch-global aggregation weights, so the grouping changes neither the loss nor the update,
only the peak memory. An episode longer than the budget cannot be split without changing its attention
context: `microbatches` raises SequenceTooLong before any forward pass (instead of an out-of-memory error
in the middle of a step), and the trainer drops such episodes up front (`drop_untrainable`).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
import torch

from turnstream.learner.batch.tensors import outside_vocabulary
from turnstream.protocol.messages import Batch

log = logging.getLogger("turnstream.learner")


class SequenceTooLong(ValueError):
    """One episode alone exceeds learner.max_tokens_per_microbatch."""

    def __init__(self, episode: str, length: int, budget: int):
        self.episode, self.length, self.budget = episode, length, budget
        super().__init__(
            f"episode {episode} has {length} tokens, more than learner.max_tokens_per_microbatch = {budget}; "
            f"raise the budget to at least {length} (if memory allows, e.g. with learner.activation_checkpointing) "
            f"or cap episode length (actor.max_turns, vllm.max_model_len)")


class NothingToTrain(ValueError):
    """Every episode of a batch was dropped (over the budget, or holding token ids the model does not have):
    the learner skips the batch and counts the episodes by reason."""

    def __init__(self, over_budget: list[SequenceTooLong], bad_tokens: list[str]):
        self.over_budget, self.bad_tokens = len(over_budget), len(bad_tokens)
        first = (str(over_budget[0]) if over_budget
                 else f"episode {bad_tokens[0]} holds token ids outside the vocabulary")
        super().__init__(f"all {self.over_budget + self.bad_tokens} episode(s) dropped; first: {first}")


def microbatches(lengths, rows: torch.Tensor, budget: int, packed: bool = False,
                 names: list[str] | None = None) -> list[torch.Tensor]:
    """Groups of `rows` within `budget` tokens (0: one group); each group's rows ascending.

    packed: sum of lengths <= budget. Padded: rows x the group's longest <= budget.
    Raises SequenceTooLong naming the first episode (`names[row]`, else its row) that alone exceeds it.
    """
    if budget <= 0 or len(rows) == 0:
        return [rows] if len(rows) else []
    lengths = np.asarray(lengths)
    order = sorted(rows.tolist(), key=lambda r: (-int(lengths[r]), r))
    if int(lengths[order[0]]) > budget:
        r = order[0]
        raise SequenceTooLong(names[r] if names else f"row {r}", int(lengths[r]), budget)
    groups: list[list[int]] = []
    if packed:
        room: list[int] = []
        for r in order:  # first fit, decreasing: within 11/9 of the fewest micro-batches
            n = int(lengths[r])
            slot = next((i for i, free in enumerate(room) if free >= n), None)
            if slot is None:
                groups.append([])
                room.append(budget)
                slot = len(groups) - 1
            groups[slot].append(r)
            room[slot] -= n
    else:
        current: list[int] = []
        for r in order:
            width = int(lengths[current[0]]) if current else int(lengths[r])
            if current and (len(current) + 1) * width > budget:
                groups.append(current)
                current = []
            current.append(r)
        if current:
            groups.append(current)
    return [torch.tensor(sorted(g), dtype=torch.long) for g in groups]


def shard(groups: list[torch.Tensor], rank: int, world: int) -> list[torch.Tensor]:
    """Round-robin micro-batches over data-parallel ranks (biggest first, so work spreads evenly)."""
    return groups[rank::world]


@dataclass
class Dropped:
    """The episodes a step could not train on."""
    over_budget: list[SequenceTooLong]
    bad_tokens: list[str]  # episode ids


def drop_untrainable(batch: Batch, budget: int, vocab_size: int) -> tuple[Batch, Dropped]:
    """The batch without the episodes over the token budget or holding token ids outside the vocabulary,
    each logged; NothingToTrain when none is left."""
    batch, too_long = drop_over_budget(batch, budget)
    for err in too_long:
        log.warning("dropped from the batch: %s", err)
    batch, bad_tokens = drop_out_of_vocabulary(batch, vocab_size)
    for episode in bad_tokens:  # an actor's tokenizer that does not match the model, most likely
        log.error("dropped from the batch: episode %s holds token ids outside the model's vocabulary of %d",
                  episode, vocab_size)
    if (too_long or bad_tokens) and not batch.episode_ids:
        raise NothingToTrain(too_long, bad_tokens)
    return batch, Dropped(too_long, bad_tokens)


def drop_over_budget(batch: Batch, budget: int) -> tuple[Batch, list[SequenceTooLong]]:
    """The batch without the episodes that alone exceed `budget`, and one error per dropped episode.

    Dropped, not truncated: the reward arrives at the episode's end, so a cut-off prefix would be trained
    on a return its actions did not earn (and GAE would need a bootstrap value at the cut); cutting from
    the front instead changes the context of every kept token, so the learner's log-probs would no longer
    be those of the policy that sampled them and the off-policy correction would be wrong.
    """
    lengths = np.diff(batch.episode_offsets)
    over = np.nonzero(lengths > budget)[0] if budget > 0 else np.zeros(0, np.int64)
    if not over.size:
        return batch, []
    errors = [SequenceTooLong(batch.episode_ids[i], int(lengths[i]), budget) for i in over]
    return subset(batch, np.nonzero(lengths <= budget)[0]), errors


def drop_out_of_vocabulary(batch: Batch, vocab_size: int) -> tuple[Batch, list[str]]:
    """The batch without the episodes holding a token id outside [0, vocab_size), and their ids. Per episode,
    not per batch: one actor's bad episode (a tokenizer that does not match the model, say) must not cost the
    good episodes it was served with. The buffer cannot check this, as it does not know the vocabulary."""
    where = np.nonzero(outside_vocabulary(batch.tokens, vocab_size))[0]
    if not where.size:
        return batch, []
    bad = np.zeros(len(batch.episode_ids), bool)
    bad[np.searchsorted(batch.episode_offsets, where, side="right") - 1] = True
    return subset(batch, np.nonzero(~bad)[0]), [batch.episode_ids[i] for i in np.nonzero(bad)[0]]


def _ranges(offsets: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat indices of the kept segments [offsets[i], offsets[i+1]), and their new offsets."""
    sizes = np.diff(offsets)[keep]
    index = (np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in keep]) if keep.size
             else np.zeros(0, np.int64))
    return index, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def subset(batch: Batch, keep: np.ndarray) -> Batch:
    """The batch with only the episodes `keep` (ascending). Fields are told apart by their length: per token
    (the token arrays), per episode (ids, keys, returns and any per-episode array), or per turn (delimited
    by `turn_offsets`), so fields added to the Batch later are carried along without a change here."""
    n_tokens, n_episodes = batch.tokens.size, len(batch.episode_ids)
    token_index, episode_offsets = _ranges(batch.episode_offsets, keep)
    changes: dict = {"episode_offsets": episode_offsets}
    starts = np.asarray(batch.context_starts)  # token offsets, not per token: mapped to where they land
    changes["context_starts"] = np.searchsorted(token_index, starts[np.isin(starts, token_index)]).astype(np.int64)
    turn_offsets = getattr(batch, "turn_offsets", None)
    per_turn = turn_offsets is not None and len(turn_offsets) == n_episodes + 1
    if per_turn:
        turn_index, changes["turn_offsets"] = _ranges(np.asarray(turn_offsets), keep)
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if f.name in changes or f.name == "allowed_sets" or not isinstance(value, (list, np.ndarray)):
            continue
        if per_turn and f.name.startswith("turn_") and isinstance(value, np.ndarray) and \
                len(value) == turn_offsets[-1] and f.name != "turn_index":
            changes[f.name] = value[turn_index]
        elif isinstance(value, np.ndarray) and value.ndim == 1 and value.size == n_tokens:
            changes[f.name] = value[token_index]
        elif len(value) == n_episodes and n_episodes:
            changes[f.name] = value[keep] if isinstance(value, np.ndarray) else [value[i] for i in keep]
    return dataclasses.replace(batch, **changes)
