"""What `turnstream inspect` shows of one recorded step, ready to render as text or HTML."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from turnstream.inspect.episodes import RecordedItem, RecordedTurn, items
from turnstream.inspect.learner_view import LearnerView
from turnstream.learner.record.reader import RecordedStep

# the learner's per-step figures shown beside a step (learner.jsonl), in this order where present
STEP_FIGURES = ("step_kl", "entropy", "policy_loss", "grad_norm", "is_weight_mean", "is_weight_max", "return_mean",
                "staleness_mean", "staleness_max", "baseline_mean", "spo_rho_mean", "explained_variance")


@dataclass
class TurnRow:
    turn: RecordedTurn
    staleness: np.ndarray  # per sampled token: the learner's version minus the token's
    advantage: np.ndarray  # per sampled token (NaN: not computed)
    learner_logprob: np.ndarray
    importance_weight: np.ndarray

    @property
    def mean_advantage(self) -> float:
        return float(np.nanmean(self.advantage)) if np.isfinite(self.advantage).any() else float("nan")


@dataclass
class EpisodeRow:
    item: RecordedItem
    turns: list[TurnRow]

    def staleness(self) -> np.ndarray:
        return np.concatenate([t.staleness for t in self.turns]) if self.turns else np.zeros(0)

    def importance_weights(self) -> np.ndarray:
        return np.concatenate([t.importance_weight for t in self.turns]) if self.turns else np.zeros(0)


@dataclass
class StepPage:
    step: RecordedStep
    figures: dict  # the step's learner.jsonl line ({} where there is none)
    episodes: list[EpisodeRow]
    learner: str  # how the learner's numbers were had, or why not

    @property
    def version(self) -> int:
        return self.step.version


def step_page(step: RecordedStep, view: LearnerView, figures: dict, learner: str) -> StepPage:
    batch = step.batch
    weights = view.importance_weight(np.asarray(batch.behav_logprobs, np.float64))
    rows = []
    for item in items(batch):
        turns = [TurnRow(t, step.learner_version - t.versions.astype(np.int64), view.advantage[t.positions],
                         view.learner_logprob[t.positions], weights[t.positions]) for t in item.turns]
        rows.append(EpisodeRow(item, turns))
    note = "; ".join(filter(None, [learner, view.note]))
    return StepPage(step, figures, rows, note)
