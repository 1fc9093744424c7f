"""`turnstream bench trl`'s plumbing: the TRL runner plays the task through the actors' chat-token path, and two
GRPOTrainer steps write the learner.jsonl that bench learning's summary reads."""
from __future__ import annotations

import asyncio
import json
import importlib.util
import math

import pytest

from benchmarks.trl_runner import Played, TrlRunSpec, play_batch


def _goal_walk():
    from turnstream.actors.envs.registry import make_env

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
    from benchmarks.trl_systems import rates
    from benchmarks.trl_runner import run
    from turnstream.reports.run_log import read_steps

    spec = TrlRunSpec(model=str(tiny_model), out=str(tmp_path), env="goal_walk", batch_episodes=8, group_size=4,
                      max_steps=2, window=8, torch_threads=1)
    run(spec)
    steps = read_steps(tmp_path)
    assert [s["version"] for s in steps] == [1, 2]
    assert all(s["episodes"] == 8 and s["tokens"] > s["action_tokens"] > 0 and s["gen_s"] > 0 for s in steps)
    # the warm clock's start: the first generate call, after the process's imports and model load
    assert steps[0]["first_sample_at"] == steps[1]["first_sample_at"] <= steps[0]["time"]
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
    with pytest.raises(SystemExit, match="share seeds with the headline"):
        parse_args(["--lr-grid", "1e-3,3e-3", "--grid-seeds", "4,5"])
    with pytest.raises(SystemExit, match="unknown tasks"):
        parse_args(["--tasks", "follow_signs,nope"])


def test_ratios_set_each_turnstream_system_against_trl_on_each_clock():
    from benchmarks.trl import ratios

    def run(system, cold, warm):
        return {"task": "follow_signs", "estimator": system, "cold_s_to_target": cold, "warm_s_to_target": warm}

    records = [run("trl", 30.0, 20.0), run("trl", 34.0, 24.0), run("trl", None, None),
               run("turnstream-sync", 25.0, 10.0), run("turnstream-sync", 27.0, 12.0),
               run("turnstream-async", None, None)]
    out = ratios(records, "follow_signs", ["trl", "turnstream-sync", "turnstream-async"])
    assert out["turnstream-sync"]["warm"] == 0.5 and out["turnstream-sync"]["cold"] == 0.812  # 11/22, 26/32
    low, high = out["turnstream-sync"]["warm_ci95"]
    assert 10 / 24 <= low <= 0.5 <= high <= 12 / 20
    assert out["turnstream-async"] == {"warm": None, "warm_ci95": None, "cold": None, "cold_ci95": None}
    assert set(out) == {"turnstream-sync", "turnstream-async"}  # TRL is the reference, not a ratio


# ---- the protocol: clocks, order, interval, cost (benchmarks/trl_protocol.py) ------------------------------

class _ConcurrencyProbe:
    """follow_signs whose steps wait on each other: records how many of a turn's steps are awaited at once."""

    in_step = 0
    most = 0

    def __init__(self):
        from turnstream.actors.envs.registry import make_env

        self.inner = make_env("follow_signs", junctions=[2])
        self.action_tokens, self.max_action_tokens = self.inner.action_tokens, self.inner.max_action_tokens

    async def reset(self, seed, task=None):
        return await self.inner.reset(seed, task)

    async def step(self, action):
        cls = type(self)
        cls.in_step += 1
        cls.most = max(cls.most, cls.in_step)
        await asyncio.sleep(0.05)
        cls.in_step -= 1
        return await self.inner.step(action)

    async def close(self):
        pass


def test_the_runner_steps_a_turns_environments_together_and_stamps_its_first_sample(tiny_model, tmp_path):
    """TRL's best form on a slow tool: a turn's environment steps are awaited concurrently, not one episode at a
    time; and the warm clock's start, its first generate call, is stamped before that call returns."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.trl_runner import SampleClock
    from turnstream.actors.inference.chat_tokens import ChatTokens

    chat = ChatTokens(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    spec = TrlRunSpec(model=str(tiny_model), out=str(tmp_path), env="follow_signs")
    clock = SampleClock()
    before = time.time()
    played = asyncio.run(play_batch(model, chat, _ConcurrencyProbe, list(range(8)), spec, clock))
    assert len(played) == 8 and all(len(p.env_mask) > 0 for p in played)
    assert _ConcurrencyProbe.most == 8  # every episode's step of a turn in flight at once
    assert before <= clock.first <= time.time()
    first = clock.first
    clock.mark()  # only the first generate call counts
    assert clock.first == first


def test_clocks_cold_from_launch_warm_from_the_first_sample():
    from benchmarks.trl_protocol import Clocks

    clocks = Clocks(launched_at=1000.0, first_sample_at=1013.5)
    assert clocks.startup_s == 13.5
    assert clocks.warm(40.0) == 26.5  # cold 40 s to the target: 13.5 s of it before the first sample
    assert clocks.warm(None) is None  # not reached
    assert Clocks(launched_at=1000.0, first_sample_at=None).warm(40.0) is None  # never sampled: no warm clock


def test_turnstreams_first_sample_is_read_from_its_actors_log(tmp_path):
    import datetime

    from benchmarks.trl_protocol import actor_first_sample

    log = tmp_path / "actor-0.log"
    log.write_text("2026-12-06 10:00:01,250 turnstream.actor INFO env follow_signs: in the event loop\n"
                   "2026-12-06 10:00:02,500 turnstream.actor INFO actor-0 (epoch 1765): 64 episodes generating, "
                   "up to 64 in flight, metrics port 9300\n"
                   "2026-12-06 10:00:09,000 turnstream.actor INFO actor-0 (epoch 1766): 64 episodes generating, "
                   "up to 64 in flight, metrics port 9300\n")  # a restarted actor: the first line counts
    expected = datetime.datetime(2026, 12, 6, 10, 0, 2, 500_000).timestamp()  # the log's stamps are local time
    assert actor_first_sample(log) == pytest.approx(expected)
    log.write_text("2026-12-06 10:00:01,250 turnstream.actor INFO env follow_signs: in the event loop\n")
    assert actor_first_sample(log) is None
    assert actor_first_sample(tmp_path / "missing.log") is None


def test_systems_interleave_per_seed_in_alternating_order():
    from benchmarks.trl_protocol import run_order

    systems = ["trl", "turnstream-async", "turnstream-grpo"]
    order = run_order(["follow_signs", "follow_signs_latency"], systems, [0, 1, 2])
    assert order[:9] == [("follow_signs", 0, "trl"), ("follow_signs", 0, "turnstream-async"),
                         ("follow_signs", 0, "turnstream-grpo"),
                         ("follow_signs", 1, "turnstream-grpo"), ("follow_signs", 1, "turnstream-async"),
                         ("follow_signs", 1, "trl"),
                         ("follow_signs", 2, "trl"), ("follow_signs", 2, "turnstream-async"),
                         ("follow_signs", 2, "turnstream-grpo")]
    assert order[9:] == [("follow_signs_latency", *run[1:]) for run in order[:9]]


def test_the_bootstrap_interval_on_the_ratio_of_medians():
    from benchmarks.trl_protocol import bootstrap_ratio

    assert bootstrap_ratio([10.0, 10.0, 10.0], [20.0, 20.0, 20.0]) == (0.5, 0.5)  # no spread, no width
    mine, trl = [8.0, 9.0, 10.0, 12.0, 30.0], [18.0, 20.0, 21.0, 25.0, 40.0]
    low, high = bootstrap_ratio(mine, trl, resamples=2000, seed=0)
    assert (low, high) == bootstrap_ratio(mine, trl, resamples=2000, seed=0)  # seeded
    # a known case: a resample of [1, 3] has the median 1, 2 or 3 with chances 1/4, 1/2, 1/4; over 2 s, the
    # ratio's 2.5% and 97.5% points are 0.5 and 1.5
    assert bootstrap_ratio([1.0, 3.0], [2.0, 2.0, 2.0], resamples=2000, seed=0) == (0.5, 1.5)
    # every resample's ratio lies between the extremes; the interval holds the point estimate 10/21
    assert 8.0 / 40.0 <= low < 10.0 / 21.0 < high <= 30.0 / 18.0
    assert bootstrap_ratio([], trl) is None and bootstrap_ratio(mine, []) is None  # a side never reached it


def test_a_runs_cpu_seconds_count_its_children_and_the_load_is_recorded():
    import subprocess
    import sys

    from benchmarks.trl_protocol import CpuMeter

    meter = CpuMeter.start()
    # a child that burns about 0.4 s of CPU, and a grandchild of it that burns as much: both count
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    spawn = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {burn!r}])\n{burn}"
    subprocess.run([sys.executable, "-c", spawn], check=True)
    cost = meter.stop()
    assert 0.8 <= cost["cpu_s"] < 5.0
    assert 0.0 <= cost["bench_cpu_s"] < 0.8  # this process only waited
    assert len(cost["load_start"]) == len(cost["load_end"]) == 3


def test_a_setting_for_all_systems_or_one_each():
    from benchmarks.trl_protocol import dtype_name, per_system

    systems = ["trl", "turnstream-async"]
    assert per_system("1e-3", systems, float, "--lr") == {"trl": 1e-3, "turnstream-async": 1e-3}
    assert per_system("trl=3e-4", systems, float, "--lr") == {"trl": 3e-4, "turnstream-async": None}
    assert per_system(None, systems, float, "--lr") == {"trl": None, "turnstream-async": None}
    with pytest.raises(SystemExit, match="--lr: unknown system 'verl'"):
        per_system("verl=1e-3", systems, float, "--lr")
    with pytest.raises(SystemExit, match="--dtype: 'float8'"):
        per_system("float8", systems, dtype_name, "--dtype")
    assert per_system("trl=bfloat16", systems, dtype_name, "--dtype") == {"trl": "bfloat16",
                                                                          "turnstream-async": None}


def test_the_grid_picks_each_systems_rate_by_seeds_reached_then_warm_time():
    from benchmarks.trl_protocol import best_rates

    def run(system, lr, warm):
        return {"task": "follow_signs", "estimator": system, "lr": lr, "warm_s_to_target": warm}

    records = [run("trl", 1e-3, 30.0), run("trl", 1e-3, None), run("trl", 3e-4, 50.0), run("trl", 3e-4, 60.0),
               run("turnstream-async", 1e-3, 10.0), run("turnstream-async", 1e-3, 12.0),
               run("turnstream-async", 3e-4, 8.0), run("turnstream-async", 3e-4, 9.0)]
    assert best_rates(records) == {"follow_signs": {"trl": 3e-4, "turnstream-async": 3e-4}}


def test_the_four_systems_settings():
    """turnstream-grpo is TRL's algorithm on turnstream: grpo on groups of TRL's size, no entropy bonus."""
    from benchmarks.trl import parse_args
    from benchmarks.trl_systems import turnstream_config

    args = parse_args(["--group-size", "4", "--batch", "32", "--lr", "turnstream-grpo=5e-4"])
    assert args.seeds == "0,1,2,3,4"
    grpo = turnstream_config("follow_signs_latency", "turnstream-grpo", 3, args)
    assert (grpo.learner.estimator, grpo.tasks.group_size, grpo.buffer.sampling) == ("grpo", 4, "group")
    assert grpo.learner.entropy_coef == 0 and grpo.learner.lr == 5e-4 and grpo.buffer.batch_episodes == 32
    assert grpo.env.name == "follow_signs_latency" and grpo.run.seed == 3 and grpo.vllm.urls == []
    sync = turnstream_config("follow_signs", "turnstream-sync", 0, args)
    assert sync.buffer.eta == 0 and sync.learner.estimator == "spo" and sync.learner.lr == "auto"
    arithmetic = turnstream_config("arithmetic", "turnstream-async", 0,
                                   parse_args(["--tasks", "arithmetic", "--dtype", "bfloat16"]))
    assert arithmetic.env.name == "arithmetic" and arithmetic.model.path.endswith("smollm2-135m")
    assert arithmetic.learner.precision == "bf16" and arithmetic.tasks.eval_split == 0
    assert arithmetic.vllm.dtype == "float32"  # the learner's precision alone (the push check's limit)
    assert arithmetic.buffer.batch_episodes == 32  # the config file's


def test_trl_is_not_handed_a_task_that_restarts_its_context(tmp_path):
    from benchmarks.trl import parse_args
    from benchmarks.trl_systems import trl_spec

    with pytest.raises(SystemExit, match="restarts its context every 1 turns"):
        trl_spec("trail", 0, tmp_path, parse_args(["--tasks", "trail", "--out", str(tmp_path)]))


def test_rates_from_a_grid_name_what_the_grid_did_not_choose(tmp_path, caplog):
    from benchmarks.trl import rates_from

    grid = tmp_path / "lr_grid.json"
    grid.write_text(json.dumps({"grid_seeds": [100, 101], "best_lr": {"follow_signs": {"trl": 1e-3}}}))
    with caplog.at_level("WARNING", logger="benchmarks.trl"):
        rates = rates_from(grid, ["follow_signs", "follow_signs_latency"], ["trl"], [0, 1])
    assert rates == {("follow_signs", "trl"): 1e-3, ("follow_signs_latency", "trl"): None}
    assert "no rate for trl on follow_signs_latency" in caplog.text
    with pytest.raises(SystemExit, match="which --seeds reuses"):
        rates_from(grid, ["follow_signs"], ["trl"], [100])


def test_records_of_split_invocations_give_the_figures_of_all_their_runs(tmp_path, capsys):
    """A protocol's seeds run in two invocations: `--records` reads both files and runs nothing; the ratio is the
    one over every run, and a run found in both files is refused rather than counted twice."""
    from benchmarks.trl import main

    def run(system, seed, warm):
        return {"task": "follow_signs", "estimator": system, "seed": seed, "warm_s_to_target": warm,
                "cold_s_to_target": warm + 10.0, "episodes_to_target": 100, "floor_s": warm, "startup_s": 10.0,
                "cpu_s": 50.0}

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [run("trl", 0, 10.0), run("turnstream-async", 0, 5.0)]))
    second.write_text("".join(json.dumps(r) + "\n" for r in [run("trl", 1, 20.0), run("turnstream-async", 1, 30.0),
                                                              run("trl", 2, 30.0), run("turnstream-async", 2, 40.0)]))
    assert main(["--records", f"{first},{second}"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["results"]["follow_signs/trl"]["seeds"] == 3
    assert out["ratios"]["follow_signs"]["turnstream-async"]["warm"] == 1.5  # median 30 over median 20
    with pytest.raises(SystemExit, match="follow_signs/trl seed 0, follow_signs/turnstream-async seed 0 more than once"):
        main(["--records", f"{first},{first}"])
    with pytest.raises(SystemExit, match="nope.jsonl: no such file"):
        main(["--records", str(tmp_path / "nope.jsonl")])
