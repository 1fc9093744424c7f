"""Episodes of a task's real environment played by its scripted solver, and the chat transcripts they make.

An episode is played as the actor's environment loop (actors/play/env_loop.py) plays it: the reset's observation
is the first user turn, the solver's answer goes to `env.step` as the decoded reply would, and each observation
that does not end the episode is the next user turn. The transcript is that conversation as chat messages, cut
where the actor restarts its context (`actor.context_turns`), so `turnstream sft` renders exactly the tokens the
actor's context holds (turnstream/sft/transcripts.py).
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from turnstream.actors.envs.registry import make_env
from turnstream.warm_start.solvers import SOLVERS


@dataclass(frozen=True)
class WarmTask:
    """A task to warm-start on: a registered environment with a solver, its arguments, and the actor's
    `context_turns` it is played with (0: the whole episode is one context)."""
    env: str
    args: dict = field(default_factory=dict)
    context_turns: int = 0

    def __post_init__(self):
        if self.env not in SOLVERS:
            raise ValueError(f"no scripted solver for {self.env!r}; tasks with one: {', '.join(SOLVERS)}")

    def actor_settings(self) -> list[str]:
        """The config overrides an actor plays this task with, as the transcripts were cut."""
        return [f"actor.context_turns={self.context_turns}"] if self.context_turns else []


# The trails are played one turn a context, as `turnstream bench learning` runs them: the sign is in the
# observation, and a whole trail (650-780 tokens) does not fit the default vllm.max_model_len
DEFAULT_CONTEXT_TURNS = {"trail": 1, "trail_longtail": 1}
DEFAULT_TASKS = ("goal_walk", "follow_signs", "follow_signs_longtail", "trail", "trail_longtail")


def task_named(env: str, args: dict | None = None) -> WarmTask:
    return WarmTask(env, dict(args or {}), DEFAULT_CONTEXT_TURNS.get(env, 0))


@dataclass
class Played:
    turns: list[tuple[str, str]]  # (observation, answer) in order, every agent's
    success: bool
    agents: list[int] = field(default_factory=list)  # the agent of each turn
    system: str | None = None  # the reset's system turn, which opens every context as the actor renders it

    def transcripts(self, context_turns: int) -> list[dict]:
        """Each agent's conversation (an agent sees only its own turns, as the actor streams it) as
        {"messages": [...]} transcripts, one per actor context."""
        out = []
        for agent in dict.fromkeys(self.agents):
            own = [turn for turn, a in zip(self.turns, self.agents) if a == agent]
            size = context_turns or len(own)
            opening = [{"role": "system", "content": self.system}] if self.system else []
            out += [{"messages": opening + [m for obs, answer in own[start:start + size]
                                            for m in ({"role": "user", "content": obs},
                                                      {"role": "assistant", "content": answer})]}
                    for start in range(0, len(own), size)]
        return out


async def play(task: WarmTask, seed: int, mistakes: float, max_turns: int = 1000) -> Played:
    """One episode of `task` with reset seed `seed`; each answer is a mistake with probability `mistakes`,
    drawn from a generator seeded by the seed (the same episode for the same arguments)."""
    env = make_env(task.env, **task.args)
    solver, rng = SOLVERS[task.env](), random.Random(f"warm-start/{seed}")
    try:
        reset = await env.reset(seed)
        observation, agent, turns, agents = reset.observation, reset.agent, [], []
        for _ in range(max_turns):
            answer = solver.act(observation, rng.random() < mistakes, rng)
            turns.append((observation, answer))
            agents.append(agent)
            step = await env.step(answer)
            if step.done:
                return Played(turns, bool((step.info or {}).get("success")) and not step.truncated, agents,
                              reset.system)
            observation = step.observation
            agent = agent if step.agent is None else int(step.agent)
        return Played(turns, False, agents, reset.system)
    finally:
        await env.close()


def play_many(task: WarmTask, seeds: range, mistakes: float) -> list[Played]:
    async def all_of() -> list[Played]:
        return [await play(task, seed, mistakes) for seed in seeds]

    return asyncio.run(all_of())
