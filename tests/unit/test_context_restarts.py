"""Contexts that restart (actor.context_turns): the actor samples a turn from its observation alone, the buffer
lays out an item from the restart its first trained turn belongs to, and the learner's forward gives every
restarted context its own attention and positions, as vLLM saw it."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.buffer.store.episodes import Episode, Segment, flatten
from turnstream.learner.batch import forward
from turnstream.learner.batch.tensors import logprobs_from_action_logits, to_tensors
from turnstream.learner.step.packing import subset
from turnstream.protocol.chunk_batch import pack, unpack
from turnstream.protocol.codec import decode, encode
from tests.learner_batches import tiny_causal_lm
from tests.unit.fakes import CollectingLink, ScriptedClient
from tests.unit.test_buffer_wal import ingest_logged, open_store
from tests.unit.test_store import chunk


async def test_the_actor_restarts_the_context_every_k_turns(tiny_model):
    chat, client, link = ChatTokens(tiny_model), ScriptedClient(seed=3), CollectingLink()
    runner = EpisodeRunner(actor_id="a", epoch=1, player=EnvironmentLoop(lambda: make_env("trail", length=7)),
                           chat=chat, client=client, link=link, sampling=Sampling(1.0, 4, 512, context_turns=3),
                           metrics=ActorMetrics(), tasks=TaskSource(RandomOrder(0)))
    await runner.play("e", seed=0, task=0)
    chunks = link.chunks
    assert len(chunks) >= 7 and chunks[-1].done
    assert [c.context_reset for c in chunks] == [t > 0 and t % 3 == 0 for t in range(len(chunks))]
    for c, prompt in zip(chunks, client.calls):
        if c.turn % 3 == 0:  # a fresh context: the observation rendered as a first turn, nothing before it
            assert prompt == c.obs_tokens.tolist() and prompt[:3] == chunks[0].obs_tokens.tolist()[:3]
        else:  # the context continues: the previous turn's prompt, its action, then this observation
            before = chunks[c.turn - 1]
            assert prompt == client.calls[c.turn - 1] + before.gen_tokens.tolist() + c.obs_tokens.tolist()
    assert [c.context_reset for c in unpack(pack(chunks))] == [c.context_reset for c in chunks]
    older = dataclasses.replace(pack(chunks), context_reset=[])  # a peer from before the field: none restarts
    assert not any(c.context_reset for c in unpack(decode(encode(older))))


def _episode(resets: set[int], n_turns: int = 6, done: bool = True) -> Episode:
    ep = Episode("e", ("a0", 0), "p")
    for t in range(n_turns):
        c = chunk(seq=t, turn=t, obs=(1, 2) if t in resets or t == 0 else (3,), gen=(10 + t, 20 + t),
                  reward=0.1 * t, done=done and t == n_turns - 1)
        c.context_reset = t in resets
        ep.add(c)
    return ep


def test_a_whole_episode_names_each_restart_and_a_segment_starts_at_its_own():
    ep = _episode({2, 4})
    whole = flatten([ep], 0, 0, 0)
    # turns: 0 [1 2 10 20], 1 [3 11 21], 2 [1 2 12 22], 3 [3 13 23], 4 [1 2 14 24], 5 [3 15 25]
    assert whole.context_starts.tolist() == [7, 14]
    assert whole.tokens[7:9].tolist() == [1, 2] and whole.tokens[14:16].tolist() == [1, 2]
    ep.served = 3  # turns 0-2 were trained in a segment: turn 3's context began at turn 2
    rest = flatten([ep], 0, 0, 0)
    assert rest.tokens.tolist() == [1, 2, 12, 22, 3, 13, 23, 1, 2, 14, 24, 3, 15, 25]
    assert rest.context_starts.tolist() == [7] and rest.first_turns.tolist() == [3]
    assert rest.turn_rewards.size == 6  # rewards still count from turn 0 (estimators index them by turn)
    assert (rest.action_mask[:4] == 0).all() and rest.action_mask[5] == 1
    seg = Segment(_episode({2, 4}), first=3, end=5, ready_at=0.0)
    seg_batch = flatten([seg], 0, 0, 0)
    assert seg.num_tokens == seg_batch.tokens.size == 13  # turns 2-4 and turn 5's observation and first token
    # two items: offsets shift with the item before, and a subset keeps each restart where its tokens went
    both = flatten([_episode(set()), _episode({2, 4})], 0, 0, 0)
    first_len = int(both.episode_offsets[1])
    assert both.context_starts.tolist() == [first_len + 7, first_len + 14]
    assert subset(both, np.array([1])).context_starts.tolist() == [7, 14]
    assert subset(both, np.array([0])).context_starts.tolist() == []


def test_the_token_budget_counts_what_an_episode_lays_out_after_its_segments():
    """select() sizes batches by num_tokens: after a segment went out, a complete episode counts the turns
    flatten() still lays out (from its next turn's context), not the whole episode."""
    for resets, served in (({2, 4}, 3), (set(), 3), ({1, 2, 3, 4, 5}, 5)):
        ep = _episode(resets)
        assert ep.num_tokens == flatten([ep], 0, 0, 0).tokens.size
        ep.serve_through(served)
        assert ep.num_tokens == flatten([ep], 0, 0, 0).tokens.size
    ep = _episode({1, 2, 3, 4, 5, 6}, n_turns=7, done=False)  # a turn arriving after the segment counts too
    ep.serve_through(4)
    ep.add(chunk(seq=7, turn=7, obs=(1, 2), gen=(17, 27), reward=0.0, done=True))
    assert ep.num_tokens == flatten([ep], 0, 0, 0).tokens.size == 4 * 4  # turns 4-7, each its own context
    ep = _episode({1, 2}, n_turns=3, done=False)
    ep.serve_through(3)  # stale turns skipped up to one not yet arrived
    late = chunk(seq=3, turn=3, obs=(1, 2), gen=(13, 23), reward=0.0, done=True)
    late.context_reset = True  # its context restarts after the last restart known at the skip
    ep.add(late)
    assert ep.num_tokens == flatten([ep], 0, 0, 0).tokens.size == 4


def test_restarts_survive_the_write_ahead_log(tmp_path):
    store, journal = open_store(tmp_path / "wal")
    for t in range(3):
        c = chunk(seq=t, turn=t, obs=(1, 2), gen=(7,))
        c.context_reset = t == 2
        assert ingest_logged(store, journal, c) == ("ok", "")
    journal.close()
    replayed, _ = open_store(tmp_path / "wal")
    assert replayed.in_progress["e0"].resets == {2}


def test_the_learner_sees_each_restarted_context_alone():
    """An item with restarts gives every action token the log-prob it has in its own context, packed or padded."""
    model = tiny_causal_lm().eval()
    ep = _episode({2, 4})
    batch = flatten([_episode(set(), 3), ep], 0, 0, 0)
    tb = to_tensors(batch, 64)
    rows = torch.arange(tb.num_episodes)
    got = {}
    with torch.no_grad():
        for packed in (True, False):
            logits = forward.action_logits(model, forward.build(tb, rows, packed)).logits
            got[packed] = logprobs_from_action_logits(logits, tb.temperature, tb.mask_id, tb.allowed, tb.act_tokens)[0]
        # the same contexts as episodes of their own: turns 0-1, 2-3, 4-5
        alone = []
        for first in (0, 2, 4):
            sub = _episode({2, 4})
            window = Episode("w", ("a0", 0), "p")
            for t in (first, first + 1):
                c = sub.turns[t]
                c.turn, c.context_reset, c.done = t - first, False, t == first + 1
                window.add(c)
            wtb = to_tensors(flatten([window], 0, 0, 0), 64)
            logits = forward.action_logits(model, forward.build(wtb, torch.arange(1), True)).logits
            alone.append(logprobs_from_action_logits(logits, wtb.temperature, wtb.mask_id, wtb.allowed,
                                                     wtb.act_tokens)[0])
    expected = torch.cat(alone)
    n_first = int((tb.act_episode == 0).sum())
    for packed in (True, False):
        torch.testing.assert_close(got[packed][n_first:], expected, atol=1e-6, rtol=0)
    # without the restarts the same tokens read differently: the check above can fail
    batch.context_starts = np.zeros(0, np.int64)
    plain = to_tensors(batch, 64)
    with torch.no_grad():
        logits = forward.action_logits(model, forward.build(plain, rows, True)).logits
    assert not torch.allclose(logprobs_from_action_logits(logits, plain.temperature, plain.mask_id, plain.allowed,
                                                          plain.act_tokens)[0][n_first:], expected, atol=1e-3)
