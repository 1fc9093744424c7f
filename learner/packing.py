"""Split a batch's episodes into micro-batches under a padded-token budget, for gradient accumulation.

Episodes are sorted by length so that each micro-batch pads to a similar width; a micro-batch costs
rows x (its longest episode) tokens. The loss uses batch-global aggregation weights, so the way episodes
are grouped here does not change the update, only the peak memory and the padding overhead.
"""
from __future__ import annotations

import numpy as np
import torch


def microbatches(lengths: np.ndarray, rows: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Groups of `rows` whose padded size rows * max_len stays within `budget` (0: one group).

    An episode longer than the budget still gets a micro-batch of its own: it cannot be split without
    changing its attention context.
    """
    if budget <= 0 or len(rows) == 0:
        return [rows] if len(rows) else []
    order = sorted(rows.tolist(), key=lambda r: (-int(lengths[r]), r))
    groups: list[list[int]] = []
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
