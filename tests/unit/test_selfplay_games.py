"""The self-play judge (benchmarks/selfplay_games.py): games between two fixed policies with the actors' chat tokens,
each agent its own conversation, the outcome told from the judged side."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM

from turnstream.actors.environment import Step
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.envs.registry import make_env
from benchmarks.selfplay_games import OUTCOMES, outcome_of, play_games


def test_outcomes_are_told_from_the_judged_side():
    win = Step("you lost", 1.0, done=True, rewards={0: 1.0, 1: -1.0}, info={"success": True, "winner": 0})
    illegal = Step("illegal move", -1.0, done=True, rewards={1: -1.0, 0: 0.0}, info={"illegal": True})
    draw = Step("draw", 0.0, done=True, rewards={0: 0.0, 1: 0.0}, info={"success": False})
    assert (outcome_of(win, 0, 0), outcome_of(win, 0, 1)) == ("line_win", "line_loss")
    assert (outcome_of(illegal, 1, 1), outcome_of(illegal, 1, 0)) == ("own_illegal", "opponent_illegal")
    assert outcome_of(draw, 0, 1) == "draw"


def test_every_game_ends_and_a_policy_sees_its_own_conversation(tiny_model):
    chat = ChatTokens(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    seen: list[list[int]] = []

    class Recording:  # the tiny model, recording the contexts it is asked to continue
        def generate(self, input_ids, attention_mask, **kw):
            seen.extend(row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask))
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, **kw)

    torch.manual_seed(0)
    counts = asyncio.run(play_games({0: Recording(), 1: model}, chat, lambda: make_env("tictactoe"),
                                    list(range(12)), judged=0, temperature=1.0))
    assert sum(counts.values()) == 12 and counts["unfinished"] == 0 and set(counts) <= set(OUTCOMES)
    assert seen and all(chat.decode(c).count("you are X") == chat.decode(c).count("user") for c in seen)
