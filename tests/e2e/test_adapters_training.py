"""The four library adapters end to end: one actor process per adapter (TextArena, TextWorld, reasoning-gym,
Gymnasium) samples from the session's real vLLM server and streams into one real buffer process, whose
batches a real learner process trains on and pushes back into the server, for a few steps."""
from __future__ import annotations

import sys
import time

import pytest

from tests.helpers import restore_served_weights, scrape, session_server_config

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

ADAPTER_ENVS = {
    # a short self-play game whose moves are single letters, so a whole game fits 512 tokens
    "textarena": {"game": "IteratedRockPaperScissors-v0", "game_kwargs": {"num_rounds": 3},
                  "action_tokens": ["r", "p", "s"], "max_action_tokens": 1},
    "textworld": {"challenge": "tw-coin_collector", "settings": {"level": 1}, "seeds": [0], "max_steps": 3,
                  "max_action_tokens": 4},
    "reasoning_gym": {"dataset": "basic_arithmetic", "config": {"size": 50}, "max_attempts": 2,
                      "max_action_tokens": 4},
    "gymnasium": {"env_id": "FrozenLake-v1", "make_kwargs": {"is_slippery": False}, "max_episode_steps": 6},
}
FINISHED = ("success", "done", "truncated")


def _try(fn, *args):
    try:
        return fn(*args)
    except OSError as exc:
        return repr(exc)


def test_every_adapter_feeds_the_buffer_and_the_learner(vllm_url, tiny_model, tmp_path):
    from turnstream.launch.processes import ProcessGroup, free_port, tail

    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.actor.concurrent_episodes = 4
    cfg.actor.max_new_tokens = 4
    cfg.buffer.batch_episodes = 8
    # Admission room well above the 16 slots: the buffer grants credits to actors in the order they first
    # asked, so when capacity binds, the fast actors (Gymnasium, TextArena) can starve one that started late.
    cfg.buffer.eta, cfg.buffer.max_staleness = 32, 32
    cfg.actor.metrics_port = free_port()  # actor i serves on metrics_port + i
    base = tmp_path / "base.toml"
    base.write_text(cfg.dumps())
    actor_configs = []
    for name, args in ADAPTER_ENVS.items():
        cfg.env.name, cfg.env.args = name, dict(args)
        if name == "textworld":
            cfg.env.args["games_dir"] = str(tmp_path / "tw-games")
        actor_configs.append(tmp_path / f"{name}.toml")
        actor_configs[-1].write_text(cfg.dumps())

    role = [sys.executable, "-m", "turnstream.cli"]
    procs = ProcessGroup(tmp_path)

    def metric(i: int, key: str) -> float:
        return scrape(f"http://127.0.0.1:{cfg.actor.metrics_port + i}/metrics").get(key, 0.0)

    def finished(i: int) -> float:
        return sum(metric(i, f'turnstream_actor_episodes_total{{outcome="{o}"}}') for o in FINISHED)

    def learner_steps() -> int:
        log = tmp_path / "run" / "learner.jsonl"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def logs() -> str:
        return "\n".join(f"--- {c.name}\n{tail(c.log_path, 15)}" for c in procs.children)

    try:
        procs.start("buffer", [*role, "buffer", "--config", str(base)])
        procs.start("learner", [*role, "learner", "--config", str(base)])
        actors = [procs.start(f"actor-{i}-{path.stem}", [*role, "actor", "--config", str(path), "--index", str(i)])
                  for i, path in enumerate(actor_configs)]
        deadline = time.monotonic() + 240
        while True:
            try:
                done = learner_steps() >= 3 and all(finished(i) >= 4 for i in range(len(actors)))
            except OSError:  # an actor's metrics server is not up yet
                done = False
            if done:
                break
            assert all(a.proc.poll() is None for a in actors), f"an actor died\n{logs()}"
            assert time.monotonic() < deadline, (f"no training on every adapter within the deadline: "
                                                 f"{learner_steps()} learner steps, episodes finished "
                                                 f"{[_try(finished, i) for i in range(len(actors))]}\n{logs()}")
            time.sleep(1)
        for i, name in enumerate(ADAPTER_ENVS):
            acked = metric(i, 'turnstream_actor_acks_total{status="ok"}')
            errors = sum(v for k, v in scrape(f"http://127.0.0.1:{cfg.actor.metrics_port + i}/metrics").items()
                         if k.startswith("turnstream_actor_env_errors_total{"))
            print(f"adapter {name}: {finished(i):.0f} episodes finished, {acked:.0f} chunks acked, "
                  f"{errors:.0f} environment errors")
            assert acked > 0 and errors == 0, name
        assert all(c.proc.poll() is None for c in procs.children), logs()
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)
