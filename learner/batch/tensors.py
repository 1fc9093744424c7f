"""Turn a wire Batch into padded tensors, and compute action log-probs from the logits at the action positions
(learner/batch/forward.py gives those) under the distribution vLLM sampled from: temperature-scaled, masked to the
allowed tokens, truncated to the top-k and top-p."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnstream.protocol.messages import Batch


@dataclass(frozen=True)
class Truncation:
    """Per action token, the truncation vLLM sampled it under: top_k (0: none) and top_p (1: none)."""

    top_k: torch.Tensor  # [n] int64
    top_p: torch.Tensor  # [n] float32

    def select(self, index: torch.Tensor, device) -> Truncation:
        return Truncation(self.top_k[index].to(device), self.top_p[index].to(device))


@dataclass
class TensorBatch:
    input_ids: torch.Tensor  # [E, L] right-padded
    attention_mask: torch.Tensor  # [E, L]
    position_ids: torch.Tensor  # [E, L]: from 0 at each episode's start and where its context restarted
    act_episode: torch.Tensor  # [N] episode row of each action token
    act_pos: torch.Tensor  # [N] position of each action token
    act_tokens: torch.Tensor  # [N]
    behav_logp: torch.Tensor  # [N]
    act_versions: torch.Tensor  # [N]
    temperature: torch.Tensor  # [N]
    mask_id: torch.Tensor  # [N], -1 = whole vocabulary
    allowed: torch.Tensor  # [S, V] bool
    tokens_per_episode: np.ndarray  # [E] action tokens per episode
    cut_pos: np.ndarray  # [E] where the critic reads a truncated episode's cut (cut_positions); -1: nowhere
    act_turn: torch.Tensor | None = None  # [N] turn index of each action token within its episode
    lengths: np.ndarray | None = None  # [E] tokens per episode (unpadded)
    # [N] False on a segment's bootstrap token: the critic is read there, nothing is trained on it
    act_trained: torch.Tensor | None = None
    # [N] True on the tokens of an episode served to the critic alone (Batch.critic_only): no policy loss reads them
    act_critic_only: torch.Tensor | None = None
    truncation: Truncation | None = None  # None: no action token was sampled under a top-k or top-p

    @property
    def num_episodes(self) -> int:
        return self.input_ids.shape[0]

    def critic_only_rows(self) -> torch.Tensor:
        """The rows of the episodes served to the critic alone (Batch.critic_only)."""
        if self.act_critic_only is None:
            return torch.zeros(0, dtype=torch.long)
        return torch.unique(self.act_episode[self.act_critic_only])

    def policy_rows(self) -> torch.Tensor:
        """The rows of every other episode, ascending: those the policy trains on."""
        rows = torch.arange(self.num_episodes)
        return rows[~torch.isin(rows, self.critic_only_rows())]


def episode_marks(marks: np.ndarray, n_episodes: int) -> np.ndarray:
    """[episodes] bool from a per-episode mark of the Batch (`replayed`, `critic_only`); empty: none is marked."""
    marks = np.asarray(marks, bool)
    return marks if marks.size == n_episodes else np.zeros(n_episodes, bool)


def outside_vocabulary(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Where a token id is not one of the model's: negative, or vocab_size and up."""
    return (tokens < 0) | (tokens >= vocab_size)


def cut_positions(batch: Batch) -> np.ndarray:
    """[episodes] where the critic reads the value of the observation at a truncated episode's cut: the position,
    in the episode's row, of the last token of the environment's reply to the last move (V of the state before
    token p is read at p - 1, so the state after the whole row is read at its last token); -1 where the batch
    holds no such reply. An episode the actor cut at its turn or context budget closes with a chunk that carries
    that reply and no action; one the environment truncated ends with the last move's own chunk, and the reply
    never travels."""
    offsets = np.asarray(batch.episode_offsets, np.int64)
    n_eps = len(offsets) - 1
    out = np.full(n_eps, -1, np.int64)
    if len(batch.truncated) != n_eps or n_eps == 0:
        return out
    lengths = np.diff(offsets)
    ends_on_reply = np.zeros(n_eps, bool)
    nonempty = lengths > 0
    ends_on_reply[nonempty] = np.asarray(batch.action_mask)[offsets[1:][nonempty] - 1] == 0
    cut = np.asarray(batch.truncated, bool) & ends_on_reply
    out[cut] = lengths[cut] - 1
    return out


def to_tensors(batch: Batch, vocab_size: int, pad_id: int = 0) -> TensorBatch:
    offsets = batch.episode_offsets
    n_eps = len(offsets) - 1
    lengths = np.diff(offsets)
    if outside_vocabulary(batch.tokens, vocab_size).any():  # Trainer.step drops such episodes before this
        raise ValueError("batch holds token ids outside the model's vocabulary")
    ids = np.full((n_eps, int(lengths.max())), pad_id, np.int64)
    att = np.zeros_like(ids)
    positions = np.zeros_like(ids)  # the padding's are never read (learner/batch/forward.py builds rows of real tokens)
    flat_positions = context_positions(offsets, batch.context_starts)
    for e in range(n_eps):
        ids[e, : lengths[e]] = batch.tokens[offsets[e]: offsets[e + 1]]
        att[e, : lengths[e]] = 1
        positions[e, : lengths[e]] = flat_positions[offsets[e]: offsets[e + 1]]
    flat_act = np.nonzero(batch.action_mask)[0]
    episode_of = np.searchsorted(offsets, flat_act, side="right") - 1
    pos = flat_act - offsets[episode_of]
    if (pos == 0).any():
        raise ValueError("an episode starts with an action token; nothing conditions it")
    act_turn = batch.turn_index[flat_act].astype(np.int64)
    bootstrap = np.asarray(batch.bootstrap_turns)
    trained = act_turn != bootstrap[episode_of] if bootstrap.size == n_eps else np.ones(flat_act.size, bool)
    allowed = torch.zeros((max(1, len(batch.allowed_sets)), vocab_size), dtype=torch.bool)
    for s, token_ids in enumerate(batch.allowed_sets):
        allowed[s, token_ids] = True
    return TensorBatch(
        input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(att), position_ids=torch.from_numpy(positions),
        act_episode=torch.from_numpy(episode_of.astype(np.int64)), act_pos=torch.from_numpy(pos.astype(np.int64)),
        act_tokens=torch.from_numpy(batch.tokens[flat_act].astype(np.int64)),
        behav_logp=torch.from_numpy(batch.behav_logprobs[flat_act].astype(np.float32)),
        act_versions=torch.from_numpy(batch.versions[flat_act].astype(np.int64)),
        temperature=torch.from_numpy(batch.temperature[flat_act].astype(np.float32)),
        mask_id=torch.from_numpy(batch.mask_id[flat_act].astype(np.int64)),
        allowed=allowed, tokens_per_episode=np.bincount(episode_of, minlength=n_eps),
        act_turn=torch.from_numpy(act_turn), lengths=lengths, act_trained=torch.from_numpy(trained),
        act_critic_only=torch.from_numpy(episode_marks(batch.critic_only, n_eps)[episode_of]),
        truncation=Truncation(torch.from_numpy(batch.top_k[flat_act].astype(np.int64)),
                              torch.from_numpy(batch.top_p[flat_act].astype(np.float32)))
        if batch.top_p.size else None,
        cut_pos=cut_positions(batch),
    )


def context_positions(offsets: np.ndarray, context_starts: np.ndarray) -> np.ndarray:
    """Every token's position in its context: counted from each item's start and each context restart."""
    starts = np.union1d(np.asarray(offsets[:-1], np.int64), np.asarray(context_starts, np.int64))
    index = np.arange(int(offsets[-1]))
    return index - starts[np.searchsorted(starts, index, side="right") - 1] if index.size else index


def max_entropy(tb: TensorBatch, vocab_size: int) -> torch.Tensor:
    """[N] the largest entropy each action token's sampling distribution can have: log of the number of
    tokens it chose among (its allowed set, or the whole vocabulary)."""
    choices = torch.full(tb.mask_id.shape, float(vocab_size))
    restricted = tb.mask_id >= 0
    choices[restricted] = tb.allowed.sum(1).float()[tb.mask_id[restricted]]
    if tb.truncation is not None:  # top-k bounds the choice too; top-p's bound varies with the logits
        top_k = tb.truncation.top_k.float()
        choices = torch.where(top_k > 0, torch.minimum(choices, top_k), choices)
    return torch.log(choices.clamp(min=2.0))  # a one-token set has no entropy to keep; avoid dividing by 0


def logprobs_from_action_logits(act_logits: torch.Tensor, temperature: torch.Tensor, mask_id: torch.Tensor,
                                allowed: torch.Tensor, tokens: torch.Tensor, truncation: Truncation | None = None,
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `tokens` and entropy under softmax(logits / T) restricted to the allowed set and truncated to
    the top-k and top-p, in fp32.

    [n, V] logits of the n action tokens (any dtype, any device; the other arguments on the same device).
    """
    act_logits = act_logits.float() / temperature[:, None]
    restricted = mask_id >= 0
    if restricted.any():
        keep = allowed[mask_id.clamp(min=0)] | ~restricted[:, None]
        act_logits = act_logits.masked_fill(~keep, float("-inf"))
    if truncation is not None:
        act_logits = act_logits.masked_fill(outside_truncation(act_logits.detach(), truncation, tokens),
                                            float("-inf"))
    logp_all = torch.log_softmax(act_logits, dim=-1)
    logp = logp_all.gather(1, tokens[:, None]).squeeze(1)
    probs = logp_all.exp()
    entropy = -(probs * torch.where(probs > 0, logp_all, torch.zeros_like(logp_all))).sum(-1)
    return logp, entropy


def outside_truncation(logits: torch.Tensor, truncation: Truncation, tokens: torch.Tensor) -> torch.Tensor:
    """[n, V] True where vLLM's top-k, then top-p, drops a token of the temperature-scaled, masked `logits`, as
    vllm/v1/sample/ops/topk_topp_sampler.py (apply_top_k_top_p_pytorch) computes it: top-k keeps every logit at
    least the k-th largest (ties too); top-p, over what top-k kept, drops the least likely tokens while their
    probabilities add up to at most 1 - p, and always keeps the most likely one.

    The sampled token is never dropped: vLLM sampled it, so it was inside vLLM's truncation. Where rounding, or a
    policy that moved since, puts it just outside the learner's, its log-prob stays finite, and the importance
    weights (is_weight_*) show how far the two distributions differ. Only the rows that truncate are sorted."""
    top_k, top_p = truncation.top_k, truncation.top_p
    outside = torch.zeros_like(logits, dtype=torch.bool)
    rows = torch.nonzero((top_k > 0) | (top_p < 1)).squeeze(1)
    if rows.numel() == 0:
        return outside
    vocab = logits.shape[1]
    ascending, order = logits[rows].sort(dim=-1)
    k = top_k[rows]
    k = torch.where((k > 0) & (k < vocab), k, vocab)
    drop = ascending < ascending.gather(1, (vocab - k)[:, None])
    ascending = ascending.masked_fill(drop, float("-inf"))
    p = top_p[rows]
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    nucleus_drop = (cumulative <= (1 - p)[:, None]) & (p < 1)[:, None]
    nucleus_drop[:, -1] = False
    drop |= nucleus_drop
    outside[rows] = torch.zeros_like(drop).scatter(1, order, drop)
    outside[rows, tokens[rows]] = False
    return outside
