"""`turnstream bench trl`'s plumbing: the TRL runner plays the task through the actors' chat-token path, and two
GRPOTrainer steps write the learner.jsonl that bench learning's summary reads."""
from __future__ import annotations

import asyncio
import importlib.util
import math

import pytest

from benchmarks.trl_runner import Played, TrlRunSpec, play_batch


def _goal_walk():
    from turnstream.actors.registry import make_env

    return make_env("goal_walk")


def test_rollout_is_the_actors_token_path(tiny_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.actors.inference.chat_tokens import ChatTokens

    chat = ChatTokens(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    torch.manual_seed(0)
    spec = TrlRunSpec(model=str(tiny_model), out=str(tmp_path), env="goal_walk")
    seeds = list(range(8))
    played: list[Played] = asyncio.run(play_batch(model, chat, _goal_walk, seeds, spec))
    actions = {chat.single_token_id("L"), chat.single_token_id("R")}
    for seed, p in zip(seeds, played):
        env = _goal_walk()
        reset = asyncio.run(env.reset(seed))
        assert p.prompt_ids == chat.first_turn(reset.observation)
        assert len(p.completion_ids) == len(p.env_mask) == len(p.logprobs)
        sampled = [t for t, m in zip(p.completion_ids, p.env_mask) if m]
        assert sampled and set(sampled) <= actions  # the environment's action mask, as vLLM applies it
        assert all(lp <= 0 for lp, m in zip(p.logprobs, p.env_mask) if m)
        # replaying the sampled actions gives the same environment turns, token for token, and the same return
        expected, ret = [], 0.0
        for token in sampled:
            step = asyncio.run(env.step(chat.decode([token])))
            ret += step.reward
            expected.append(token)
            if step.done:
                assert p.success == bool(step.info["success"])
                break
            expected += chat.next_turn(step.observation, [token])
        assert p.completion_ids == expected
        assert p.episode_return == ret


@pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                    reason="TRL is not installed (scripts/setup.sh installs the trl extra: pip install -e '.[trl]')")
def test_two_grpo_steps_write_learner_jsonl(tiny_model, tmp_path):
    from benchmarks.learning import summarize_run
    from benchmarks.trl import rates
    from benchmarks.trl_runner import run
    from turnstream.report import read_steps

    spec = TrlRunSpec(model=str(tiny_model), out=str(tmp_path), env="goal_walk", batch_episodes=8, group_size=4,
                      max_steps=2, window=8, torch_threads=1)
    run(spec)
    steps = read_steps(tmp_path)
    assert [s["version"] for s in steps] == [1, 2]
    assert all(s["episodes"] == 8 and s["tokens"] > s["action_tokens"] > 0 and s["gen_s"] > 0 for s in steps)
    summary = summarize_run("goal_walk", "trl", 0, steps, spec.window, 1.0, steps[0]["step_started"])
    assert summary["episodes"] == 16 and summary["steps"] == 2 and not math.isnan(summary["entropy_start"])
    r = rates(steps, sum(s["action_tokens"] for s in steps), sum(s["gen_s"] for s in steps))
    assert r["gen_tokens_per_s"] > 0 and r["train_tokens_per_s"] > 0


def test_bench_arguments_are_checked():
    from benchmarks.trl import parse_args

    with pytest.raises(SystemExit, match="unknown systems"):
        parse_args(["--systems", "trl,verl"])
    with pytest.raises(SystemExit, match="multiple of --group-size"):
        parse_args(["--batch", "10", "--group-size", "4"])


def test_ratios_set_each_figure_against_trls_wall_time():
    from benchmarks.trl import ratio

    summary = {"follow_signs/trl": {"wall_s_median": 20.0, "floor_s_median": 12.0},
               "follow_signs/turnstream-sync": {"wall_s_median": 16.0, "floor_s_median": 9.0},
               "follow_signs/turnstream-async": {"wall_s_median": None, "floor_s_median": None}}
    assert ratio(summary, "follow_signs", "turnstream-sync") == 0.8
    assert ratio(summary, "follow_signs", "turnstream-sync", "floor_s_median") == 0.45
    assert ratio(summary, "follow_signs", "turnstream-async") is None  # it missed the target
    assert ratio(summary, "goal_walk", "turnstream-sync") is None  # not run


def test_the_checkpoints_parameters_are_counted_from_its_files(tmp_path):
    """TRL is handed the rates turnstream's learner picks for the checkpoint's size, counted without loading it."""
    from benchmarks.trl import checkpoint_parameters
    from tests.learner_batches import tiny_causal_lm
    from turnstream.learner.scale_defaults import parameter_count

    model = tiny_causal_lm()
    model.save_pretrained(tmp_path / "model")
    assert checkpoint_parameters(tmp_path / "model") == parameter_count(model)
    with pytest.raises(FileNotFoundError, match="no safetensors files"):  # a count of 0 would read as the tiny model
        checkpoint_parameters(tmp_path)
