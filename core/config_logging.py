"""The [logging] table: where the learner's per-step metrics go besides Prometheus and learner.jsonl.

The trackers live in learner/trackers.py and import their packages (the `integrations` extra) only when one
is configured, so a learner without them runs with the default `trackers = []`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from turnstream.core.config_fields import Section
from turnstream.core.configtools import require

Tracker = Literal["tensorboard", "wandb"]


class LoggingSection(Section):
    trackers: list[Tracker] = Field(
        default_factory=list, description="experiment trackers the learner writes each step's metrics (and the "
        "evaluation success rate of eval.jsonl) to: tensorboard, wandb; needs the integrations extra")
    dir: str = Field("", description="where the trackers write (TensorBoard event files, W&B's run folder); "
                     "empty: <run_dir>/trackers")
    wandb_project: str = Field("turnstream", description="the W&B project of the run")
    wandb_entity: str = Field("", description="the W&B entity (user or team); empty: the key's default")
    wandb_name: str = Field("", description="the W&B run name; empty: the run directory's name")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="offline writes the run to disk only (upload it later with `wandb sync`); online "
        "streams it to the W&B server and needs a key (WANDB_API_KEY or `wandb login`)")

    @model_validator(mode="after")
    def _each_tracker_once(self) -> LoggingSection:
        require(len(set(self.trackers)) == len(self.trackers), "trackers", f"each at most once, got {self.trackers}")
        return self
