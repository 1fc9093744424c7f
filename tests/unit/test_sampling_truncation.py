"""top-p / top-k sampling end to end without a server: the actor asks vLLM for them and records them per turn,
the wire and the buffer carry them to the learner, and the learner truncates its log-probs as vLLM does (checked
against hand computations here; against a real server in tests/e2e/test_vllm_roundtrip.py)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from turnstream.actors.inference.client import Generation
from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import PlayContext, Sampling
from turnstream.actors.play.stream import Stream
from turnstream.buffer.store.validate import rejections
from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError, from_dict
from turnstream.learner.batch.tensors import Truncation, logprobs_from_action_logits, max_entropy, to_tensors
from turnstream.protocol.chunk_batch import BatchError, pack, unpack
from turnstream.protocol.codec import decode, encode
from tests.unit.fake_vllm import FakeVllm
from tests.unit.fakes import CollectingLink
from tests.unit.test_codec import sample_turn_chunk
from tests.unit.test_loss_and_batching import V, BigramModel, make_chunk, served_batch

PROBS = [0.4, 0.3, 0.15, 0.1, 0.05]  # one action token's distribution over a 5-token vocabulary


def _logp(top_k: int, top_p: float, token: int, temperature: float = 1.0, allowed: list[int] | None = None):
    """The learner's log-prob of `token` (and the entropy) for the PROBS row under this truncation."""
    logits = torch.tensor([PROBS]).log()
    mask_id = torch.tensor([-1 if allowed is None else 0])
    allowed_sets = torch.zeros((1, len(PROBS)), dtype=torch.bool)
    allowed_sets[0, allowed or []] = True
    logp, entropy = logprobs_from_action_logits(logits, torch.tensor([temperature]), mask_id, allowed_sets,
                                                torch.tensor([token]),
                                                Truncation(torch.tensor([top_k]), torch.tensor([top_p])))
    return logp.item(), entropy.item()


@pytest.mark.parametrize("top_k, top_p, token, kept", [
    (2, 1.0, 0, [0, 1]),  # the two most likely
    (0, 0.8, 2, [0, 1, 2]),  # ascending sums .05, .15 are <= 1 - p = .2: tokens 4 and 3 go
    (0, 0.9, 3, [0, 1, 2, 3]),  # .05 <= .1 goes, .15 stays: only the tail that fits under 1 - p goes
    (0, 0.99, 4, [0, 1, 2, 3, 4]),  # .05 <= .01 fails: nothing goes
    # top-k first, then top-p over what it kept: [.4, .3] / .7 -> .43 <= .5, token 1 goes (top-p alone keeps it)
    (2, 0.5, 0, [0]),
    (3, 0.65, 1, [0, 1]),  # [.4, .3, .15] / .85: .18 <= .35 goes, .53 stays
    (0, 1.0, 4, [0, 1, 2, 3, 4]),  # off
])
def test_truncated_logprob_is_the_renormalised_kept_probability(top_k, top_p, token, kept):
    logp, entropy = _logp(top_k, top_p, token)
    mass = sum(PROBS[i] for i in kept)
    assert logp == pytest.approx(math.log(PROBS[token] / mass), abs=1e-6)
    assert entropy == pytest.approx(-sum(PROBS[i] / mass * math.log(PROBS[i] / mass) for i in kept), abs=1e-6)


def test_truncation_applies_to_the_tempered_masked_distribution():
    # T = 0.5 squares the probabilities: [.16, .09, .0225, .01, .0025]; top-k 2 keeps the first two
    assert _logp(2, 1.0, 1, temperature=0.5)[0] == pytest.approx(math.log(0.09 / 0.25), abs=1e-6)
    # allowed {1, 2, 3}: top-k 2 keeps 1 and 2 of them
    assert _logp(2, 1.0, 2, allowed=[1, 2, 3])[0] == pytest.approx(math.log(0.15 / 0.45), abs=1e-6)


def test_top_k_keeps_ties_as_vllm_does():
    logits = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    logp, _ = logprobs_from_action_logits(logits, torch.ones(1), torch.tensor([-1]), torch.zeros((1, 4), dtype=bool),
                                          torch.tensor([2]), Truncation(torch.tensor([2]), torch.tensor([1.0])))
    assert logp.item() == pytest.approx(math.log(1 / 3), abs=1e-6)


def test_the_sampled_token_is_kept_where_the_learner_would_drop_it():
    # top-k 1 keeps token 0 only; vLLM sampled token 1, so it was inside vLLM's truncation: kept, finite
    logp, _ = _logp(1, 1.0, 1)
    assert logp == pytest.approx(math.log(0.3 / 0.7), abs=1e-6)


def test_untruncated_rows_are_untouched_and_the_gradient_stays_finite():
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0), requires_grad=True)
    args = (torch.tensor([0.7, 1.0, 1.3]), torch.full((3,), -1), torch.zeros((1, 7), dtype=bool),
            torch.tensor([0, 1, 2]))
    plain, plain_ent = logprobs_from_action_logits(logits, *args)
    logp, entropy = logprobs_from_action_logits(logits, *args, Truncation(torch.tensor([0, 3, 0]),
                                                                         torch.tensor([1.0, 0.9, 1.0])))
    assert torch.equal(logp[[0, 2]], plain[[0, 2]]) and torch.equal(entropy[[0, 2]], plain_ent[[0, 2]])
    assert logp[1] > plain[1]  # renormalised over fewer tokens
    (logp.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()
    kept = set(logits[1].topk(3).indices.tolist()) | {1}  # top-k 3, and the sampled token
    assert torch.nonzero(logits.grad[1]).flatten().tolist() == sorted(kept)  # the dropped ones get no gradient


# ---- the wire and the buffer -------------------------------------------------------------------------------

def _truncated(chunk, top_p=0.9, top_k=20):
    return dataclasses.replace(chunk, top_p=top_p, top_k=top_k)


def test_chunks_carry_their_truncation_and_untruncated_ones_send_nothing():
    plain, cut = sample_turn_chunk(), dataclasses.replace(_truncated(sample_turn_chunk()), seq=18)
    assert pack([plain]).top_p == [] and pack([plain]).top_k == []
    back = unpack(decode([bytes(f) for f in encode(pack([plain, cut]))]))
    assert [(c.top_p, c.top_k) for c in back] == [(1.0, 0), (pytest.approx(0.9), 20)]
    batch = pack([plain, cut])
    batch.top_k = batch.top_k[:1]
    with pytest.raises(BatchError, match="top_k"):
        unpack(batch)


@pytest.mark.parametrize("top_p, top_k", [(0.0, 0), (1.5, 0), (float("nan"), 0), (0.9, -1)])
def test_a_chunk_with_an_impossible_truncation_is_rejected(top_p, top_k):
    chunks = [sample_turn_chunk(), dataclasses.replace(_truncated(sample_turn_chunk(), top_p, top_k), seq=18)]
    assert rejections(pack(chunks), chunks) == ["", "bad_scalar"]


def _served_truncated_batch():
    """served_batch's episodes, episode "a" (its 3 action tokens) sampled under top-k 3, top-p 0.9."""
    from turnstream.buffer.store.episodes import Episode, flatten

    chunks = [
        make_chunk(0, "a", 0, (1, 2), (3, 4), (-0.3, -1.1), False, temperature=0.7),
        make_chunk(1, "b", 0, (8, 9, 10), (5,), (-0.6,), True),
        make_chunk(2, "a", 1, (6,), (7,), (-2.0,), True, temperature=0.7),
    ]
    chunks = [_truncated(c, 0.9, 3) if c.episode_id == "a" else c for c in chunks]
    episodes = {}
    for c in chunks:
        episodes.setdefault(c.episode_id, Episode(c.episode_id, ("a", 0), c.prompt_key)).add(c)
    return flatten([episodes["b"], episodes["a"]], request_id=0, learner_version=0, dropped_stale=0)


def test_the_buffer_serves_each_tokens_truncation_and_the_learner_applies_it():
    assert served_batch().top_p.size == 0 and to_tensors(served_batch(), V).truncation is None
    batch = decode(encode(_served_truncated_batch()))
    np.testing.assert_array_equal(batch.top_k, [0, 0, 0, 0, 3, 3, 3, 3, 3, 3])
    np.testing.assert_allclose(batch.top_p, [1, 1, 1, 1, .9, .9, .9, .9, .9, .9])
    tb = to_tensors(batch, V)
    assert tb.truncation.top_k.tolist() == [0, 3, 3, 3]
    assert max_entropy(tb, V).tolist() == pytest.approx([math.log(V)] + [math.log(3)] * 3)

    from tests.learner_logprobs import action_logprobs

    model = BigramModel(seed=2)
    logp, _ = action_logprobs(model, tb)
    for i, (prev, token) in enumerate([(10, 5), (2, 3), (3, 4), (6, 7)]):
        probs = torch.softmax(model.table[prev].double() / float(tb.temperature[i]), -1)
        if i:  # episode "a": top-k 3, then top-p .9 over those three
            kept = probs.topk(3).indices.tolist()
            kept_probs = probs[kept] / probs[kept].sum()
            dropped = torch.cumsum(kept_probs.flip(0), 0) <= 0.1  # least likely first
            kept = [t for t, d in zip(kept, dropped.flip(0).tolist()) if not d or t == token]
            probs = probs / probs[kept].sum()
        assert logp[i].item() == pytest.approx(math.log(probs[token].item()), abs=1e-5)


# ---- the actor ---------------------------------------------------------------------------------------------

async def test_the_fleet_asks_vllm_for_the_truncation_and_the_generation_records_it():
    server = await FakeVllm().start()
    try:
        async with InferenceFleet([server.url], health_interval_s=0) as fleet:
            plain = await fleet.generate([1, 2], max_tokens=2, temperature=1.0)
            cut = await fleet.generate([1, 2], max_tokens=2, temperature=1.0, top_p=0.9, top_k=20)
    finally:
        await server.stop()
    assert "top_p" not in server.sampling_params[0] and "top_k" not in server.sampling_params[0]
    assert server.sampling_params[1]["top_p"] == 0.9 and server.sampling_params[1]["top_k"] == 20
    assert (plain.top_p, plain.top_k, cut.top_p, cut.top_k) == (1.0, 0, 0.9, 20)


async def test_a_turn_records_the_truncation_its_generation_was_sampled_under(tiny_model):
    from turnstream.actors.inference.chat_tokens import ChatTokens

    link = CollectingLink()
    ctx = PlayContext("a", 1, ChatTokens(tiny_model), None, link, Sampling(1.0, 4, 512, top_p=0.5, top_k=2),
                      ActorMetrics())
    stream = Stream(episode_id="e", prompt_key="k", agent=0)
    gen = Generation([7], [-0.1], [0], "length", top_p=0.9, top_k=20)  # e.g. an agent's request
    await ctx.send(stream, [1, 2], gen, [], 0.0, done=False, truncated=False, t_start=0.0)
    await ctx.send(stream, [3], None, [], 1.0, done=True, truncated=True, t_start=0.0)
    assert [(c.top_p, c.top_k) for c in link.chunks] == [(0.9, 20), (1.0, 0)]


def test_actor_settings_are_checked():
    cfg = from_dict(Config, {"actor": {"top_p": 0.9, "top_k": 20}})
    assert (cfg.actor.top_p, cfg.actor.top_k) == (0.9, 20)
    for bad in ({"top_p": 0.0}, {"top_p": 1.1}, {"top_k": -1}):
        with pytest.raises(ConfigError, match="actor.top_"):
            from_dict(Config, {"actor": bad})
