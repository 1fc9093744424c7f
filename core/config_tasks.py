"""The [tasks] table: which task each new episode of an actor plays, and how many episodes play it.

The actor's task source (actors/tasks/) reads it; the buffer's group sampling reads `group_size` from
here too, so that the n episodes an actor plays of one task are the n the buffer waits for.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from turnstream.core.config_fields import Section
from turnstream.core.configtools import require


class TasksSection(Section):
    order: Literal["random", "sequential", "spo"] = Field(
        "random", description="random: every draw a fresh random task (the reset seed names it); sequential: "
        "epochs over the environment's task list (it must enumerate its tasks), shuffled per epoch with "
        "run.seed and split between the actor processes; spo: SPO's curriculum, task x drawn with probability "
        "proportional to sqrt(v(1 - v)) + spo_epsilon, v the learner's tracker value of its prompt "
        "(learner.estimator = spo, an enumerating environment)")
    spo_epsilon: float = Field(0.05, gt=0, description="order = spo: the weight floor of solved and hopeless tasks")
    group_size: int = Field(1, ge=1, description="n: each drawn task is played by n consecutive episodes of one "
                            "actor (same seed and task, so the same prompt_key); buffer.sampling = group serves "
                            "those n together")
    epochs: int = Field(0, ge=0, description="order = sequential: passes over the task list before the actors "
                        "stop playing; 0: unlimited")
    eval_split: float = Field(0.0, ge=0, lt=1, description="fraction of the environment's tasks held out for "
                              "evaluation (it must enumerate its tasks): chosen with run.seed, never drawn by the "
                              "training order, played every eval_every learner versions and never streamed to the "
                              "buffer; 0: no evaluation")
    eval_every: int = Field(10, ge=1, le=1_000_000, description="eval_split > 0: learner versions between "
                            "evaluation rounds (a round at version 0, then each time the version passes a multiple)")
    eval_episodes: int = Field(0, ge=0, le=1_000_000, description="eval_split > 0: episodes per evaluation round, "
                               "over all actor processes (the held-out tasks in turn, each the same seed every "
                               "round); 0: each held-out task once")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> TasksSection:
        require(self.epochs == 0 or self.order == "sequential", "epochs", "only order = sequential has epochs")
        require(self.eval_episodes == 0 or self.eval_split > 0, "eval_episodes",
                "only with eval_split > 0 (no task is held out for evaluation)")
        return self
