"""What a recorded step's learner made of its batch: per sampled token, its advantage, the learner's log-prob and
the importance weight pi_learner / mu (mu: the sampling policy), computed by the learner's own code.

With the Trainer as it was before the step (turnstream/replay/rebuild.py trainer_at): the no-grad pass the step
reads pi_prox from, then the run's estimator (learner/estimators/), over the whole batch. Without it, the
estimators that read no learner state (grpo, rloo, gigpo, mars) still give advantages; those that do
(Estimator.reads_learner_state: SPO's tracker, a critic) do not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from turnstream.core.config import LearnerSection
from turnstream.learner.estimators.episodes import token_agent_ids
from turnstream.learner.estimators.registry import estimator_for
from turnstream.learner.batch.tensors import TensorBatch, to_tensors
from turnstream.learner.scale_defaults import resolve_for_checkpoint
from turnstream.learner.step.packing import NothingToTrain, drop_untrainable
from turnstream.protocol.messages import Batch


@dataclass
class LearnerView:
    """Per token of the batch; NaN on observation tokens and wherever it was not computed."""

    advantage: np.ndarray
    learner_logprob: np.ndarray
    note: str = ""  # what is missing, and why
    dropped: tuple[str, ...] = ()  # episodes the learner dropped from the batch (too long, unknown token ids)

    def importance_weight(self, behav_logprobs: np.ndarray) -> np.ndarray:
        """pi_learner / mu per token, before the run's cap or mask (learner.behaviour_weights)."""
        return np.exp(self.learner_logprob - behav_logprobs)


def empty_view(batch: Batch, note: str) -> LearnerView:
    nan = np.full(np.asarray(batch.tokens).size, np.nan)
    return LearnerView(nan, nan.copy(), note)


def view_with_trainer(trainer, batch: Batch) -> LearnerView:
    """`trainer` holds the learner's state before the step that trained `batch` (its version: the batch's)."""
    cfg: LearnerSection = trainer.cfg
    kept, dropped = _trainable(batch, cfg, trainer.vocab_size)
    if kept is None:
        return empty_view(batch, "the learner dropped every episode of this batch")
    tb = to_tensors(kept, trainer.vocab_size, trainer.pad_id)
    estimator = trainer.estimator
    logp, values = trainer.proximal_pass(tb, values=estimator.needs_critic)  # the step's own pi_prox
    advantages = estimator.advantages(kept, tb, values, token_agent_ids(kept, tb) if cfg.agent_norm else None)
    return _placed(batch, kept, tb, advantages.token_adv.numpy(), logp.numpy(), "", dropped)


def view_without_trainer(cfg: LearnerSection, model_path: str, batch: Batch) -> LearnerView:
    vocab = int(json.loads((Path(model_path) / "config.json").read_text())["vocab_size"])
    cfg = resolve_for_checkpoint(cfg, model_path)  # the micro-batch budget the learner would have chosen
    kept, dropped = _trainable(batch, cfg, vocab)
    if kept is None:
        return empty_view(batch, "the learner dropped every episode of this batch")
    estimator = estimator_for(cfg)
    if estimator.reads_learner_state:
        note = (f"no advantages: the {cfg.estimator} estimator reads the learner's state (rebuilt unless "
                "--no-learner); no learner log-probs")
        return empty_view(batch, note)
    tb = to_tensors(kept, vocab)
    advantages = estimator.advantages(kept, tb, None, token_agent_ids(kept, tb) if cfg.agent_norm else None)
    nan = np.full(tb.act_tokens.numel(), np.nan)
    return _placed(batch, kept, tb, advantages.token_adv.numpy(), nan, "no learner log-probs (--no-learner)",
                   dropped)


def _trainable(batch: Batch, cfg: LearnerSection, vocab: int) -> tuple[Batch | None, tuple[str, ...]]:
    try:
        kept, dropped = drop_untrainable(batch, cfg.max_tokens_per_microbatch, vocab)
    except NothingToTrain:
        return None, tuple(batch.episode_ids)
    return kept, tuple(e for e in batch.episode_ids if e not in set(kept.episode_ids))


def _placed(batch: Batch, kept: Batch, tb: TensorBatch, advantage: np.ndarray, logp: np.ndarray, note: str,
            dropped: tuple[str, ...]) -> LearnerView:
    """Per action token values of the kept batch, placed at their tokens in the whole batch."""
    index = {e: i for i, e in enumerate(batch.episode_ids)}
    rows = np.array([index[e] for e in kept.episode_ids], np.int64)
    where = np.asarray(batch.episode_offsets)[rows[tb.act_episode.numpy()]] + tb.act_pos.numpy()
    view = empty_view(batch, note)
    view.advantage[where], view.learner_logprob[where] = advantage, logp
    view.dropped = dropped
    if dropped:
        view.note = "; ".join(filter(None, [note, f"dropped by the learner: {', '.join(dropped)}"]))
    return view
