"""Supervised training on rendered transcripts with the learner's model code, then a Hugging Face directory.

The transcripts travel as the learner's own batch (a protocol `Batch`: tokens, and the assistant tokens as the
action mask), so the learner's code does the rest as it does for RL: `to_tensors`, micro-batches under
`learner.max_tokens_per_microbatch` (packed or padded, learner/step/packing.py), the forward at the action
positions only (learner/batch/forward.py), log-probs in fp32 (learner/batch/tensors.py), the device and
autocast of learner/device.py. The loss is the negative log-likelihood of the assistant tokens, averaged over
a step's assistant tokens; the model trains in eval mode (no dropout), as the learner does.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from turnstream.core.config_learner import LearnerSection
from turnstream.core.config_sft import SftSection
from turnstream.core.configtools import ConfigError
from turnstream.learner.checkpoint.layout import copy_side_files
from turnstream.learner.device import (Placement, attn_implementation, enable_checkpointing,
                                       keep_checkpointing_active, model_dtype, placement)
from turnstream.learner.batch import forward
from turnstream.learner.batch.tensors import TensorBatch, logprobs_from_action_logits, to_tensors
from turnstream.learner.scale_defaults import parameter_count, resolve
from turnstream.learner.step.packing import microbatches
from turnstream.protocol.messages import Batch
from turnstream.sft.transcripts import Rendered

log = logging.getLogger("turnstream.sft")


@dataclass
class Progress:
    steps: int = 0
    losses: list[float] = field(default_factory=list)  # each step's loss, before its update


def as_batch(items: list[Rendered]) -> Batch:
    """Transcripts as the learner's batch: one episode each, its assistant tokens the actions, sampled at
    temperature 1 from the whole vocabulary (the distribution SFT fits)."""
    tokens = np.concatenate([np.asarray(r.tokens, np.int32) for r in items])
    n = tokens.size
    return Batch(request_id=0, learner_version=0, episode_ids=[f"line-{r.line}" for r in items],
                 prompt_keys=[f"line-{r.line}" for r in items], returns=[0.0] * len(items), tokens=tokens,
                 action_mask=np.concatenate([np.asarray(r.trained, np.uint8) for r in items]),
                 behav_logprobs=np.zeros(n, np.float32), versions=np.zeros(n, np.int32),
                 turn_index=np.zeros(n, np.int32), temperature=np.ones(n, np.float32),
                 mask_id=np.full(n, -1, np.int32),
                 episode_offsets=np.concatenate([[0], np.cumsum([len(r.tokens) for r in items])]).astype(np.int64))


class SftTrainer:
    def __init__(self, model_dir: str | Path, sft: SftSection, learner: LearnerSection, seed: int = 0):
        from transformers import AutoModelForCausalLM

        self.sft, self.model_dir = sft, Path(model_dir)
        self.where: Placement = placement(learner.device, learner.precision)
        attn = attn_implementation(learner.attn_implementation, self.where.device)
        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, **({"attn_implementation": attn} if attn else {})).to(self.where.device)
        # the micro-batch budget left at "auto" follows the model's size, as the RL learner's does
        self.learner = learner = resolve(learner, parameter_count(self.model))
        if learner.activation_checkpointing:
            enable_checkpointing(self.model)
        self.model.train(False)
        keep_checkpointing_active(self.model)
        self.vocab_size, self.pad_id = self.model.config.vocab_size, self.model.config.pad_token_id or 0
        self.packed = forward.packs(self.model, learner.pack_sequences, learner.max_tokens_per_microbatch)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=sft.lr, weight_decay=learner.weight_decay,
                                           fused=self.where.device.type == "cuda")
        self.generator = torch.Generator().manual_seed(seed)

    def train(self, items: list[Rendered]) -> Progress:
        """`sft.epochs` shuffled passes of `sft.batch_transcripts` transcripts a step, or `sft.max_steps` steps."""
        progress, s = Progress(), self.sft
        for _ in range(s.epochs):
            for rows in torch.randperm(len(items), generator=self.generator).split(s.batch_transcripts):
                loss, tokens = self.step([items[i] for i in rows.tolist()])
                progress.steps += 1
                progress.losses.append(loss)
                log.info("sft step %d: loss %.4f over %d assistant tokens", progress.steps, loss, tokens)
                if s.max_steps and progress.steps >= s.max_steps:
                    return progress
        return progress

    def step(self, items: list[Rendered]) -> tuple[float, int]:
        """One optimizer step; (its loss before the update, the assistant tokens it averaged over)."""
        tb = to_tensors(as_batch(items), self.vocab_size, self.pad_id)
        n = tb.act_tokens.numel()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for rows in microbatches(tb.lengths, torch.arange(tb.num_episodes), self.learner.max_tokens_per_microbatch,
                                 self.packed):
            mb = forward.build(tb, rows, self.packed, self.where.device)
            loss = -self._logprobs(tb, mb).sum() / n
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.learner.max_grad_norm)
        self.optimizer.step()
        return total, n

    @torch.no_grad()
    def mean_loss(self, items: list[Rendered]) -> float:
        """The loss on `items` at the current weights, no update."""
        tb = to_tensors(as_batch(items), self.vocab_size, self.pad_id)
        total = sum(float(-self._logprobs(tb, forward.build(tb, rows, self.packed, self.where.device)).sum())
                    for rows in microbatches(tb.lengths, torch.arange(tb.num_episodes),
                                             self.learner.max_tokens_per_microbatch, self.packed))
        return total / max(1, tb.act_tokens.numel())

    def _logprobs(self, tb: TensorBatch, mb: forward.MicroBatch) -> torch.Tensor:
        with self.where.autocast():
            logits = forward.action_logits(self.model, mb).logits
        temperature, mask_id, tokens = forward.sampling_params(tb, mb.select, self.where.device)
        return logprobs_from_action_logits(logits, temperature, mask_id, tb.allowed.to(self.where.device), tokens)[0]

    def save(self, out: str | Path) -> Path:
        """The trained model as a Hugging Face directory in the source checkpoint's dtype, with its tokenizer
        and side files (what vLLM and a run's model.path read); written aside, then renamed into place."""
        out = Path(out)
        require_empty(out)
        tmp = out.parent / f".tmp-{out.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.to(model_dtype(self.model_dir)).save_pretrained(tmp, safe_serialization=True)
        copy_side_files(self.model_dir, tmp)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        return out


def require_empty(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"sft.output_dir: {out} exists and is not an empty directory")
