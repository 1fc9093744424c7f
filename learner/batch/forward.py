"""One micro-batch's model inputs on the device, and the model outputs at its action positions only.

Packed: the micro-batch's episodes are concatenated into one row [1, T] with position ids that restart
at 0 for each episode and no attention mask. transformers reads the episode boundaries from the position
ids (a position that does not follow its predecessor starts a new sequence) and builds a block-diagonal
causal mask (sdpa, eager) or cu_seqlens (flash-attention), so no token sees another episode, and rotary
positions are each episode's own: the log-probs equal the padded forward's (tests/unit/test_learner_gpu_ready.py).
`use_cache=False` is required for that: with a KV cache object transformers skips the packed-sequence check.
Padded: one row per context [R, W], right-padded, with no attention mask either: under a causal mask no real
token sees the padding after it. A context is an episode, or each part of one whose context restarted
(Batch.context_starts): the packed row restarts the position ids there, which the same boundary reading turns
into a context of its own, and the padded form gives it a row, so a long episode of short contexts costs
attention over each context, not over the episode.

Only the action positions need logits: the LM head runs on those rows alone (`logits_to_keep` with an
index tensor), which for a 150k-token vocabulary saves most of the head's FLOPs and the [T, V] logits tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from turnstream.learner.batch.tensors import TensorBatch, Truncation


@dataclass
class MicroBatch:
    rows: torch.Tensor  # episode rows of the batch, ascending (CPU)
    select: torch.Tensor  # [N] bool over the batch's action tokens: those of these rows (CPU)
    input_ids: torch.Tensor  # [1, T] packed or [R, W] padded (a row per context), on the device
    position_ids: torch.Tensor  # the same shape
    act_index: torch.Tensor  # packed: [n] positions in the row; padded: [2, n] (row, column); on the device
    tokens: int  # real (unpadded) tokens
    packed: bool
    # the rows whose truncated episode's cut the critic reads (TensorBatch.cut_pos; CPU), and where, laid out
    # as act_index
    cut_rows: torch.Tensor
    cut_index: torch.Tensor

    def inputs(self) -> dict:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False}

    def at_actions(self, per_position: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] per-position outputs at the position before each action token, in flat action order."""
        return self._at(per_position, self.act_index)

    def at_cuts(self, per_position: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] per-position outputs at each cut_rows' cut, in cut_rows' order."""
        return self._at(per_position, self.cut_index)

    def _at(self, per_position: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return per_position[0, index] if self.packed else per_position[index[0], index[1]]


def packs_without_full_square(model) -> bool:
    """Whether this attention implementation skips the other episodes of a packed row (cu_seqlens, or flex
    attention's block mask) rather than computing the row's full square under a block-diagonal mask."""
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    return impl.startswith("flash_attention") or impl == "flex_attention"


def packs(model, pack_sequences: bool | str, max_tokens_per_microbatch: int) -> bool:
    """Whether micro-batches are packed rows (learner.pack_sequences); ConfigError where transformers cannot
    keep packed episodes apart. Packing only under a budget: without one, the whole batch would become one row,
    and attention kernels without cu_seqlens (sdpa, eager) pay for the full square of its length, far more than
    padding costs. For the same reason "auto" packs only where attention skips the row's other episodes."""
    auto = pack_sequences == "auto" and packs_without_full_square(model)
    packed = (pack_sequences is True or auto) and max_tokens_per_microbatch > 0
    if packed:
        check_packing_support(model)
    return packed


def check_packing_support(model) -> None:
    """Fail at start-up, not silently: packed rows are only isolated where transformers reads episode
    boundaries from the position ids (its masking_utils packed-sequence detection, or flash-attention)."""
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl.startswith("flash_attention"):
        return
    import importlib

    import transformers

    try:
        supported = hasattr(importlib.import_module("transformers.masking_utils"), "find_packed_sequence_indices")
    except ImportError:
        supported = False
    if not supported:
        from turnstream.core.configtools import ConfigError

        raise ConfigError(f"learner.pack_sequences: transformers {transformers.__version__} with {impl} attention "
                          "does not separate packed episodes; set it to false or upgrade transformers")


def build(tb: TensorBatch, rows: torch.Tensor, packed: bool, device: torch.device | str = "cpu") -> MicroBatch:
    rows = rows.sort().values
    select = torch.isin(tb.act_episode, rows)
    lengths = tb.lengths[rows.numpy()]
    pairs = list(zip(rows.tolist(), lengths.tolist()))
    flat_ids = torch.cat([tb.input_ids[r, :n] for r, n in pairs])
    flat_positions = torch.cat([tb.position_ids[r, :n] for r, n in pairs])
    start_of = torch.zeros(tb.num_episodes, dtype=torch.long)
    start_of[rows] = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
    at = start_of[tb.act_episode[select]] + tb.act_pos[select] - 1  # the logits predicting token p sit at p - 1
    cut_pos = torch.from_numpy(tb.cut_pos[rows.numpy()])
    cut_rows = rows[cut_pos >= 0]
    cut_at = start_of[cut_rows] + cut_pos[cut_pos >= 0]
    tokens = int(lengths.sum())
    if packed:
        return MicroBatch(rows, select, flat_ids[None].to(device), flat_positions[None].to(device), at.to(device),
                          tokens, packed=True, cut_rows=cut_rows, cut_index=cut_at.to(device))
    # one row per context (an episode, or each context it restarted), as wide as the longest: a token's position
    # is its column, and no row computes attention over the contexts before it
    context_start = torch.nonzero(flat_positions == 0).squeeze(1)
    context_len = torch.diff(context_start, append=torch.tensor([tokens]))
    width = int(context_len.max())
    ids = torch.zeros((len(context_start), width), dtype=flat_ids.dtype)
    ids[torch.repeat_interleave(torch.arange(len(context_start)), context_len), flat_positions] = flat_ids

    def row_and_column(flat: torch.Tensor) -> torch.Tensor:
        row = torch.searchsorted(context_start, flat, right=True) - 1
        return torch.stack([row, flat - context_start[row]]).to(device)

    position_ids = torch.arange(width).expand(len(context_start), width)
    return MicroBatch(rows, select, ids.to(device), position_ids.to(device), row_and_column(at), tokens,
                      packed=False, cut_rows=cut_rows, cut_index=row_and_column(cut_at))


def action_logits(model, mb: MicroBatch, **kwargs):
    """The model's output object, with `.logits` [n, V] at the action positions only (flat action order)."""
    if mb.packed:
        out = model(**mb.inputs(), logits_to_keep=mb.act_index, **kwargs)
        out.logits = out.logits[0]
    else:
        out = model(**mb.inputs(), **kwargs)
        out.logits = mb.at_actions(out.logits)
    return out


def sampling_params(tb: TensorBatch, select: torch.Tensor, device) -> tuple[torch.Tensor, ...]:
    """Per action token (temperature, mask id, chosen token) of the selected tokens, on the device."""
    return (tb.temperature[select].to(device), tb.mask_id[select].to(device), tb.act_tokens[select].to(device))


def truncation(tb: TensorBatch, select: torch.Tensor, device) -> Truncation | None:
    """The top-k / top-p of the selected action tokens, on the device; None where the batch truncates none."""
    return None if tb.truncation is None else tb.truncation.select(select, device)
