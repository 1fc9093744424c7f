"""Held-out evaluation (`tasks.eval_split`): the rounds that play the tasks never trained on (which ones:
actors/tasks/eval_split.py).

The rounds. An `Evaluator` runs next to the actor's episode slots. A round starts when the learner version
the actor last heard from the buffer reaches 0, eval_every, 2 * eval_every, ... (versions passed during a
round are not played afterwards: the next round is at the newest multiple reached). It plays the round's
episodes with the runner's own player (same environment, chat template, inference fleet, frozen agents,
training temperature) in a copy of the runner's context whose link drops every chunk: an evaluation episode
is never streamed, takes no credit, and so cannot reach the buffer, let alone a training batch. This is
enforced where the chunks leave rather than by marking them for the buffer and learner to skip, so no other
role needs to know about evaluation and no mistake there can leak one into a batch.

Who plays what. Round episode p (p < eval_episodes, or each held-out task once) plays held-out task
p mod (split size) with reset seed p, the same every round, so rounds differ only in the policy. The
positions are split between the actor processes like the sequential order's (actor k of N takes k, k + N,
...), so evaluation costs each actor 1/N of a round; each actor appends its own part to
`<run_dir>/eval.jsonl` as {"version", "success", "episodes", "time", "actor"}, and `turnstream report`
pools the lines of one version (episode-weighted). `success` is the share of scored episodes (finished or
truncated) that the environment reported successful; abandoned ones (inference or environment failure)
are counted in `turnstream_actor_eval_episodes_total` but not scored. When scored episodes reported figures
(the numbers of their last `Step.info`, play/episode_figures.py), the line also has "info", each key's mean over
the scored episodes that reported it, and "info_episodes", how many did. Evaluation episodes add to the
actor's turn and token counters (they do load the servers) but not to `turnstream_actor_episodes_total`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Sequence

from turnstream.actors.play.episode_figures import EpisodeFigures, FigureMeans
from turnstream.actors.play.player import Episode
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.actors.tasks.eval_split import split_tasks

log = logging.getLogger("turnstream.actor")

SCORED = ("success", "done", "truncated")  # outcomes that say something about the policy


def round_plan(held_out: Sequence[int], episodes: int = 0, shard: int = 0,
               num_shards: int = 1) -> list[tuple[int, int]]:
    """(reset seed, task) of this actor's episodes in every round: positions shard, shard + num_shards, ... of
    the round's `episodes` (0: one per held-out task), position p playing task held_out[p % len] with seed p."""
    total = episodes or len(held_out)
    return [(p, held_out[p % len(held_out)]) for p in range(shard, total, num_shards)]


class _Unstreamed:
    """The link of the evaluation episodes: forwards the learner version, drops every chunk."""

    def __init__(self, link):
        self.link, self.dropped = link, 0

    @property
    def learner_version(self) -> int:
        return self.link.learner_version

    async def send(self, chunk) -> None:
        self.dropped += 1


class Evaluator:
    def __init__(self, runner: EpisodeRunner, held_out: Sequence[int], *, every: int,
                 version: Callable[[], int | None], episodes: int = 0, shard: int = 0, num_shards: int = 1,
                 concurrency: int = 1, log_path: str | Path | None = None, poll_s: float = 0.5):
        """`runner`: the actor's EpisodeRunner (its player, and its context with a link that streams nothing);
        `version`: the learner version the actor knows, None until it has heard from the buffer."""
        self.player = runner.player
        self.context = dataclasses.replace(runner.context, link=_Unstreamed(runner.context.link))
        self.plan = round_plan(held_out, episodes, shard, num_shards)
        self.every, self.version, self.concurrency = every, version, concurrency
        self.log_path = Path(log_path) if log_path else None
        self.poll_s = poll_s
        self.m = runner.context.metrics

    async def run(self) -> None:
        """Play a round at every multiple of `every` the learner version reaches; never returns (the actor
        stops when one of its tasks does)."""
        if not self.plan:
            log.info("%s: no evaluation episodes for this actor (more actors than episodes per round)",
                     self.context.actor_id)
            await asyncio.Event().wait()
        due = 0
        while True:
            version = self.version()
            if version is None or version < due:
                await asyncio.sleep(self.poll_s)
                continue
            label = version - version % self.every
            await self.play_round(label)
            due = label + self.every

    async def play_round(self, version: int) -> dict | None:
        """Play this actor's part of the round at `version`; returns the line written (None: nothing scored)."""
        limit = asyncio.Semaphore(self.concurrency)

        async def one(i: int, seed: int, task: int) -> tuple[str, EpisodeFigures]:
            async with limit:
                ctx = self.context
                episode = Episode(f"{ctx.actor_id}-{ctx.epoch}-eval{version}-{i}", seed, task)
                outcome = await self.player.play(ctx, episode)
            self.m.eval_episodes.labels(outcome).inc()
            return outcome, episode.figures

        played = await asyncio.gather(*(one(i, seed, task) for i, (seed, task) in enumerate(self.plan)))
        scored = [(o, figures) for o, figures in played if o in SCORED]
        if not scored:
            log.warning("evaluation round at version %d: no episode finished (%s)", version, [o for o, _ in played])
            return None
        successes = sum(o == "success" for o, _ in scored)
        line = {"version": version, "success": successes / len(scored), "episodes": len(scored),
                "time": time.time(), "actor": self.context.actor_id}
        figures = FigureMeans.of(f for _, f in scored)
        if figures.means:
            line |= {"info": figures.means, "info_episodes": figures.episodes}
        self.m.eval_success.set(line["success"])
        self.m.eval_version.set(version)
        if self.log_path is not None:
            append_line(self.log_path, line)
        log.info("evaluation at version %d: %.3f success over %d episodes", version, line["success"], len(scored))
        return line


def evaluator_for(cfg, runner: EpisodeRunner, env, actor_index: int) -> Evaluator:
    """The evaluator of actor `actor_index` under the run's config (`tasks.eval_split` > 0); `env` an instance of
    the run's environment (make_order has checked that it enumerates its tasks)."""
    t, link = cfg.tasks, runner.context.link
    _, held_out = split_tasks(int(env.num_tasks), t.eval_split, cfg.run.seed)
    return Evaluator(runner, held_out, every=t.eval_every, episodes=t.eval_episodes, shard=actor_index,
                     num_shards=cfg.actor.num_processes, concurrency=cfg.actor.concurrent_episodes,
                     log_path=Path(cfg.run.run_dir) / "eval.jsonl",
                     # version 0 means nothing until the buffer has answered (a restarted actor starts at 0)
                     version=lambda: link.learner_version if link.server_id else None)


def append_line(path: Path, record: dict) -> None:
    """One JSON line, in one write on an O_APPEND descriptor: several actor processes append to one file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)
