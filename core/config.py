"""The run configuration: one TOML file, one table per role; every field is documented in its `description`.

Ports set to 0 are chosen by the launcher (`turnstream up` / `demo`), which writes the resolved file into the
run directory and hands that file to every role. Loading checks types, bounds and the rules between fields;
the checks that need role code (environment name, rate limiter, CURVE keys) are the CLI's pre-flight
(turnstream/checks/preflight.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from turnstream.core.config_buffer import BufferSection
from turnstream.core.config_fields import Section
from turnstream.core.config_inference import (ActorSection, DiskWeightSyncConfig, NcclWeightSyncConfig,
                                              VllmSection)
from turnstream.core.config_launch import LaunchSection
from turnstream.core.config_learner import CRITIC_ESTIMATORS, CriticSection, LearnerSection, SpoSection
from turnstream.core.config_logging import LoggingSection
from turnstream.core.config_network import NetworkSection
from turnstream.core.config_sft import SftSection
from turnstream.core.config_tasks import TasksSection
from turnstream.core.configtools import ConfigError, apply_override, dump_toml, from_dict, load_toml, require

TINY_MODEL_PATH = "runs/tiny-model"  # where the default model.path names the tiny model; built there when missing


class RunSection(Section):
    name: str = Field("run", description="the run's name (metrics labels, reports)")
    run_dir: str = Field("runs/run", description="logs, weights, checkpoints; relative to the working directory")
    seed: int = Field(0, description="seed of every role's random numbers")
    time_limit_s: float = Field(600.0, gt=0, description="the launcher stops everything after this long")
    target_success: float = Field(0.9, gt=0, le=1, description="`demo` stops once the rolling success reaches this")
    rolling_episodes: int = Field(256, ge=1, description="window of the rolling success rate")


class ModelSection(Section):
    path: str = Field(TINY_MODEL_PATH, description="Hugging Face checkpoint directory; the default is the tiny "
                      "model, which commands that start vLLM build there when it is missing")
    tiny_seed: int = Field(0, description="seed of the tiny model when it is built")
    frozen_path: str = Field("", description="checkpoint of the fixed opponent (actor.frozen_agents); empty: path")


class EnvSection(Section):
    """The run's environment, how long its calls may take and where it runs (actors/envs/guard/)."""

    name: str = Field("follow_signs", description="a name from `turnstream envs`")
    args: dict[str, Any] = Field(default_factory=dict, description="passed to the environment's constructor")
    reset_timeout_s: float = Field(60.0, gt=0, description="time limit of an environment's reset (with isolation "
                                   "= process also of creating it); past it the episode is abandoned (kind timeout). "
                                   "An environment's own reset_timeout_s attribute wins over this")
    step_timeout_s: float = Field(60.0, gt=0, description="time limit of an environment's step; past it the episode "
                                  "is abandoned (kind timeout). An environment's own step_timeout_s attribute wins")
    close_timeout_s: float = Field(10.0, gt=0, description="time limit of an environment's close; past it the close "
                                   "is given up (logged, counted), the slot goes on. An environment's own "
                                   "close_timeout_s attribute wins")
    loop_block_warn_s: float = Field(0.02, gt=0, description="with isolation = loop, an environment call that holds "
                                     "the actor's event loop longer than this at a stretch is counted and logged "
                                     "(every episode of the actor waits meanwhile)")
    isolation: Literal["loop", "process"] = Field(
        "loop", description="loop: environments run on the actor's event loop; process: in worker processes "
        "(blocking code, a crash or runaway memory costs only the episodes of one worker, which is replaced)")
    workers: int = Field(0, ge=0, description="worker processes per actor with isolation = process; 0: auto, the "
                         "machine's CPU count clamped to 2..4")
    worker_memory_mb: int = Field(0, ge=0, description="a worker whose resident memory exceeds this is killed and "
                                  "replaced, its episodes abandoned (kind worker_memory); 0: no limit")


class Config(Section):
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    vllm: VllmSection = Field(default_factory=VllmSection)
    env: EnvSection = Field(default_factory=EnvSection)
    network: NetworkSection = Field(default_factory=NetworkSection)
    actor: ActorSection = Field(default_factory=ActorSection)
    tasks: TasksSection = Field(default_factory=TasksSection)
    buffer: BufferSection = Field(default_factory=BufferSection)
    learner: LearnerSection = Field(default_factory=LearnerSection)
    launch: LaunchSection = Field(default_factory=LaunchSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    sft: SftSection = Field(default_factory=SftSection)

    @model_validator(mode="after")
    def _cross_table_rules(self) -> Config:
        require(self.tasks.order != "spo" or self.learner.estimator == "spo", "tasks.order",
                "spo reads the SPO tracker's values, which only learner.estimator = spo keeps")
        require(self.buffer.sampling != "group" or self.tasks.group_size <= self.buffer.batch_episodes,
                "tasks.group_size", f"must be <= buffer.batch_episodes ({self.buffer.batch_episodes}) with "
                "buffer.sampling = group, or no group fits in a batch (deadlock)")
        require(self.learner.estimator != "gigpo" or (self.buffer.sampling == "group" and self.tasks.group_size >= 2),
                "learner.estimator", "gigpo compares the episodes of one task, step by step: it needs "
                "buffer.sampling = group and tasks.group_size >= 2")
        require(self.learner.mars.baseline != "group" or (self.buffer.sampling == "group" and self.tasks.group_size >= 2),
                "learner.mars.baseline", "group compares a turn with its game group's turns of the same seat: it "
                "needs buffer.sampling = group and tasks.group_size >= 2")
        require(self.buffer.segment_turns == 0 or self.learner.estimator in CRITIC_ESTIMATORS,
                "buffer.segment_turns", "a segment of an open episode is trained by bootstrapping from the critic: "
                "it needs learner.estimator = turn_gae, token_gae or turn_td")
        critic_replay = self.buffer.critic_replay.share > 0
        require(not critic_replay or self.learner.estimator in CRITIC_ESTIMATORS, "buffer.critic_replay.share",
                "serves episodes to the critic alone: needs learner.estimator = turn_td (or turn_gae, token_gae)")
        require(not critic_replay or self.buffer.segment_turns == 0, "buffer.critic_replay.share",
                "serves whole episodes again: needs buffer.segment_turns = 0")
        require(not critic_replay or self.buffer.critic_replay.max_staleness >= self.buffer.max_staleness,
                "buffer.critic_replay.max_staleness", f"must be >= buffer.max_staleness ({self.buffer.max_staleness}): "
                "the critic's bound is the looser one")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.run_dir)

    def dumps(self) -> str:
        # TOML has no null: an unset optional table (learner.lora) is left out, and reloads as unset
        return dump_toml(self.model_dump(exclude_none=True))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    data = load_toml(path) if path else {}
    for item in overrides or []:
        apply_override(data, item)
    return from_dict(Config, data)


__all__ = ["ActorSection", "BufferSection", "Config", "ConfigError", "CriticSection", "DiskWeightSyncConfig",
           "EnvSection", "LaunchSection", "LearnerSection", "LoggingSection", "ModelSection", "NcclWeightSyncConfig", "NetworkSection", "RunSection",
           "SftSection", "SpoSection", "TINY_MODEL_PATH", "TasksSection", "VllmSection", "load_config"]
