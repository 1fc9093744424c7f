"""Games of a two-player environment between two fixed policies, for judging a self-play run: every open game's
turn sampled in one batched transformers `generate` per policy, with the actors' chat tokens and each agent's
own conversation (actors/play/env_loop.py), so a policy sees exactly what it saw in training.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from turnstream.actors.environment import Environment
from benchmarks.trl_runner import sample_turn

# a game is won by a line or by the other side's illegal move (which ends it: a forfeit)
OUTCOMES = ("line_win", "line_loss", "draw", "own_illegal", "opponent_illegal", "unfinished")


@dataclass
class Game:
    env: Environment
    agent: int = 0  # whose move it is
    observation: str = ""
    contexts: dict[int, list[int]] = field(default_factory=dict)
    last: dict[int, list[int]] = field(default_factory=dict)  # each agent's last reply
    outcome: str = "unfinished"


def outcome_of(step, mover: int, judged: int) -> str:
    info = step.info or {}
    if info.get("illegal"):
        return "own_illegal" if mover == judged else "opponent_illegal"
    rewards = step.rewards or {}
    mine = float(rewards.get(judged, step.reward if mover == judged else 0.0))
    return "line_win" if mine > 0 else "line_loss" if mine < 0 else "draw"


async def play_games(policies: dict[int, object], chat, make_env: Callable[[], Environment], seeds: list[int], *,
                     judged: int, temperature: float, max_turns: int = 32) -> Counter:
    """One game per seed, agent k played by `policies[k]` (a transformers causal LM); the outcomes of agent
    `judged`, counted."""
    games = [Game(make_env()) for _ in seeds]
    for g, seed in zip(games, seeds):
        reset = await g.env.reset(seed)
        g.agent, g.observation = reset.agent, reset.observation
    env0 = games[0].env
    allowed = [chat.single_token_id(a) for a in env0.action_tokens] if env0.action_tokens else []
    max_tokens = env0.max_action_tokens
    open_ = list(games)
    for _ in range(max_turns):
        if not open_:
            break
        for agent, policy in policies.items():
            movers = [g for g in open_ if g.agent == agent and g.outcome == "unfinished"]
            if not movers:
                continue
            for g in movers:
                turn = chat.first_turn(g.observation) if agent not in g.last else chat.next_turn(
                    g.observation, g.last[agent])
                g.contexts[agent] = g.contexts.get(agent, []) + turn
            replies = sample_turn(policy, [g.contexts[agent] for g in movers], max_tokens, allowed,
                                  chat.end_of_turn_id, pad_id=chat.end_of_turn_id, temperature=temperature)
            for g, (ids, _) in zip(movers, replies):
                g.contexts[agent] += ids
                g.last[agent] = ids
                step = await g.env.step(chat.decode(ids))
                if step.done:
                    g.outcome = outcome_of(step, agent, judged)
                    continue
                g.agent = agent if step.agent is None else int(step.agent)
                g.observation = step.observation
        open_ = [g for g in open_ if g.outcome == "unfinished"]
    for g in games:
        await g.env.close()
    return Counter(g.outcome for g in games)
