"""Which episodes each optimizer step of a learner step trains, kept apart by whom they train.

The policy's episodes are shuffled and split into `learner.minibatches`, every epoch; the episodes served to the
critic alone (Batch.critic_only) join the step's last update only. So every policy update of the step, the
last one's included, reads a critic that no critic-only episode has moved yet, and the shuffle draws over the
policy's rows alone: which policy episodes share an update, and the generator's later draws, are those of the
batch without them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from turnstream.learner.batch.tensors import TensorBatch


@dataclass
class UpdateRows:
    """One optimizer step's episode rows (of the step's TensorBatch)."""
    policy: torch.Tensor  # trained by the policy loss and the value loss
    critic_only: torch.Tensor  # trained by the value loss alone, in a pass of their own (learner/step/trainer.py)

    def all(self) -> torch.Tensor:
        return torch.cat([self.policy, self.critic_only])


def update_rows(tb: TensorBatch, minibatches: int, generator: torch.Generator, last_epoch: bool) -> list[UpdateRows]:
    """The rows of each update of one epoch; the critic-only episodes go with the last update of the last."""
    policy, critic = tb.policy_rows(), tb.critic_only_rows()
    chunks = policy[torch.randperm(len(policy), generator=generator)].chunk(minibatches) if len(policy) else []
    updates = [UpdateRows(chunk, critic[:0]) for chunk in chunks]
    if last_epoch and len(critic):
        if not updates:
            updates.append(UpdateRows(policy, critic[:0]))
        updates[-1].critic_only = critic
    return updates
