"""benchmarks/learner.py runs end to end on tiny settings and prints one JSON line last; benchmarks/learning.py's
summaries; benchmarks/learner_parallel.py's count of bytes."""
from __future__ import annotations

import json

import pytest

from benchmarks import learner, learning
from tests.learner_rollouts import TorchSampler


def last_json(capsys) -> dict:
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return json.loads(lines[-1])


def test_bench_learner_smoke(capsys):
    assert learner.main(["--episodes", "8", "--steps", "1", "--estimators", "grpo,spo_updated,turn_gae_microbatch",
                         "--pack-sequences", "false"]) == 0
    out = last_json(capsys)
    assert out["pack_sequences"] == "false"
    assert out["grpo_ratio"] > 0 and out["spo_updated_tokens_per_s"] > 0 and out["bare_tokens_per_s"] > 0
    assert out["turn_gae_microbatch_ratio"] > 0


def test_bench_learner_context_rows_smoke(capsys):
    assert learner.main(["--context-turns", "1", "--turns", "4", "--episodes", "4", "--steps", "1"]) == 0
    out = last_json(capsys)
    assert out["context_rows_step_s"] > 0 and out["episode_rows_step_s"] > 0 and out["context_rows_speedup"] > 0


def test_bench_learner_long_tail_times_one_microbatch_against_the_auto_budget(capsys):
    assert learner.main(["--long-tail", "--episodes", "32", "--steps", "1"]) == 0
    out = last_json(capsys)
    assert out["auto_budget"] == 4096 and out["longest_episode"] > 0
    assert out["one_microbatch_step_s"] > 0 and out["auto_budget_step_s"] > 0 and out["speedup"] > 0


def test_trail_runs_with_its_settings_for_every_estimator():
    """The long trail's settings reach every estimator's config alike; the estimator's own come after them."""
    args = learning.parse_args(["--model", "m"])
    for estimator in ("turn_gae+segments", "spo", "grpo"):
        cfg = learning.run_config("trail", estimator, 0, "http://127.0.0.1:1", args)
        assert (cfg.actor.context_turns, cfg.learner.batch_max_tokens, cfg.learner.lr) == (1, 20000, 0.001)
    assert learning.run_config("goal_walk", "spo", 0, "http://127.0.0.1:1", args).actor.context_turns == 0


def test_bench_learning_summaries(tmp_path):
    """Episodes and seconds are those of the first step whose rolling success reached the target."""
    steps = [{"episodes": 100, "return_mean": r, "time": 1000.0 + 10 * i, "entropy": 0.7 - 0.1 * i, "step_kl": 0.01,
              "step_s": 7.0, "step_started": 992.0 + 10 * i, "dropped_stale": i,
              "critic_turns_by_staleness": {"2": 3, str(4 + i): 2}}  # as JSON has them: keys are strings
             for i, r in enumerate([0.1, 0.5, 0.95, 0.95, 1.0])]
    steps[0]["wait_s"] = 1.5  # the learner was ready 0.5 s in and waited for the first batch
    run = learning.summarize_run("goal_walk", "spo", 0, steps, window=200, target=0.9, t0=990.0, max_staleness=4)
    assert (run["episodes_to_target"], run["wall_s_to_target"]) == (400, 40.0)  # (0.95 + 0.95) / 2 at step 4
    # the first step started 2 s in; 4 steps of 7 s in the 40 s to the target
    assert run["first_step_s"] == 2.0 and run["learner_busy"] == pytest.approx(28.0 / 40.0)
    # had sampling cost nothing: ready at 0.5 s, then the 4 steps' own 7 s each
    assert run["floor_s"] == 0.5 + 4 * 7.0
    assert run["dropped_stale"] == 0 + 1 + 2 + 3  # episodes the buffer dropped as stale, to the target
    assert run["critic_turns_beyond_bound"] == 0 + 2 + 2 + 2  # critic-only turns past max_staleness 4, to the target
    assert run["success_start"] == 0.1 and run["success_end"] == pytest.approx(0.975)
    missed = learning.summarize_run("goal_walk", "spo", 1, steps[:2], window=200, target=0.9, t0=990.0,
                                    max_staleness=4)
    assert missed["episodes_to_target"] is None and missed["wall_s_to_target"] is None and missed["floor_s"] is None
    assert missed["learner_busy"] == pytest.approx(14.0 / 20.0)  # a run that missed: busy over all of it
    run.update(turn_to_train_s=2.5, turn_to_train_versions=0.5)  # the buffer's latency, scraped by run_one
    summary = learning.aggregate([run, missed])
    assert summary == {"goal_walk/spo": {"reached": 1, "seeds": 2, "episodes_median": 400, "wall_s_median": 40.0,
                                         "floor_s_median": 28.5,
                                         "success_end_mean": round((0.975 + 0.3) / 2, 3), "first_step_s_median": 2.0,
                                         "learner_busy_median": pytest.approx((0.7 + 0.7) / 2),
                                         "dropped_stale_median": (6 + 1) / 2, "critic_turns_beyond_bound_median": (6 + 2) / 2,
                                         "turn_to_train_s_median": 2.5, "turn_to_train_versions_median": 0.5}}
    assert "goal_walk/spo" in learning.format_table(summary)
    assert run["curve"][-1] == [500, pytest.approx(0.975)]
    assert learning.plot([run, missed], 0.9, tmp_path / "learning.png").stat().st_size > 0


def test_sampler_respects_the_allowed_tokens_and_reports_their_logprobs():
    import math

    import torch

    from tests.learner_batches import tiny_causal_lm

    sampler = TorchSampler(tiny_causal_lm(), 0.7, torch.Generator().manual_seed(0))
    tokens, logps = sampler.sample([[1, 2, 3], [4, 5]], allowed=[7, 9])
    assert set(tokens) <= {7, 9}
    assert all(lp <= 0 and math.isfinite(lp) for lp in logps)


def test_bench_learner_mfu_mode_at_tiny_size(capsys):
    """The GPU benchmark's code path, on the CPU at the tiny size: real Trainer steps on packed rows."""
    args = ["--model-config", "tiny", "--device", "cpu", "--seq-len", "256", "--microbatches", "2", "--steps", "1"]
    assert learner.main(args) == 0
    out = last_json(capsys)
    assert out["device"] == "cpu" and out["precision"] == "fp32" and out["mfu"] is None  # no CPU peak claimed
    assert out["tokens_per_s"] > 0 and out["step_s"] > 0 and out["model_tflops_per_step"] > 0
    assert out["tokens_per_step"] <= out["microbatches_per_step"] * 256 and 0 < out["packing_efficiency"] <= 1
    assert out["peak_memory_gib"] > 0 and "6*N_body*T" in out["mfu_formula"]


def test_mfu_flops_formula():
    from benchmarks.learner_mfu import model_config, step_flops

    cfg = model_config("1.5b")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (28, 1536, 151936)
    # dense + LM head at action positions + causal attention over each packed episode
    assert step_flops(cfg, 10, 100, 7, 50) == 6 * 10 * 100 + 6 * 151936 * 1536 * 7 + 6 * 28 * 12 * 128 * 50


def test_bench_learning_trains_group_estimators_on_groups_and_the_curriculum_variant_with_the_spo_order(tmp_path):
    args = learning.parse_args(["--out", str(tmp_path)])
    grpo = learning.run_config("follow_signs6", "grpo", 0, "http://127.0.0.1:1", args)
    assert (grpo.learner.estimator, grpo.tasks.group_size, grpo.buffer.sampling) == ("grpo", 8, "group")
    spo = learning.run_config("reasoning_gym", "spo+curriculum", 0, "http://127.0.0.1:1", args)
    assert (spo.learner.estimator, spo.tasks.order, spo.tasks.group_size) == ("spo", "spo", 1)
    assert spo.env.name == "reasoning_gym" and spo.env.args["config"]["size"] == 500
    gigpo = learning.run_config("goal_walk", "gigpo", 0, "http://127.0.0.1:1", args)
    assert (gigpo.learner.estimator, gigpo.tasks.group_size, gigpo.buffer.sampling) == ("gigpo", 8, "group")
    plain = learning.run_config("follow_signs6", "grpo", 0, "http://127.0.0.1:1",
                                learning.parse_args(["--group-size", "1", "--out", str(tmp_path)]))
    assert (plain.tasks.group_size, plain.buffer.sampling) == (1, "fifo")


def test_bench_groups_reads_the_buffers_group_counters():
    from prometheus_client import start_http_server

    from benchmarks.groups import buffer_counters
    from turnstream.buffer.metrics import BufferMetrics
    from turnstream.launch.processes import free_port

    metrics = BufferMetrics()
    metrics.groups_served.inc(3)
    metrics.samples.inc(24)
    metrics.dropped.labels("group_timeout").inc(5)
    metrics.dropped.labels("stale").inc(7)  # another reason: not counted as a short group
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    try:
        assert buffer_counters(port) == {"groups": 3, "episodes_served": 24, "dropped_group_timeout": 5,
                                         "dropped_uniform_group": 0}
    finally:
        server.shutdown()
        thread.join()


def test_state_bytes_counts_parameters_gradients_and_adam_moments():
    """bench learner --parallel's memory figure: what the optimizer's parameters, their gradients and its state
    hold."""
    import torch

    from benchmarks.learner_parallel import state_bytes
    from tests.learner_batches import tiny_causal_lm

    model = tiny_causal_lm()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params)
    model(input_ids=torch.arange(1, 9)[None], labels=torch.arange(1, 9)[None]).loss.backward()
    optimizer.step()
    n = sum(p.numel() for p in params)
    got = state_bytes(optimizer)
    assert (got["params"], got["grads"]) == (4 * n, 4 * n)
    assert got["optimizer"] == 8 * n + 4 * len(params)  # two fp32 moments, and a step count per tensor
    assert got["total"] == sum(got[k] for k in ("params", "grads", "optimizer"))
