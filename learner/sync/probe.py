"""The probe a push is verified with: a fixed short token sequence, scored by the learner's model and by a server.

Both sides give the log-probability of each probe token after the tokens before it (the first token has none):
the learner from a forward of the weights it just pushed, under the served dtype's arithmetic; a server from
vLLM's prompt log-probs (`/inference/v1/generate` with `prompt_logprobs`, the route actors sample from), so
the server scores with the weights that would sample the actors' next tokens. learner/sync/verify.py
compares the two.
"""
from __future__ import annotations

import asyncio

import aiohttp
import torch

from turnstream.learner.sync.base import WeightSyncError

PROBE_LENGTH = 16
# Ids below this are ordinary tokens in any real tokenizer; above it some reserve special or padding ids that a
# server may refuse in a prompt (a vocabulary padded past its tokenizer's last id).
ORDINARY_IDS = 32000


def probe_tokens(vocab_size: int) -> tuple[int, ...]:
    """The fixed probe: PROBE_LENGTH ids spread over the ordinary part of the vocabulary (a prime stride)."""
    n = min(vocab_size, ORDINARY_IDS)
    return tuple((3 + 7919 * i) % n for i in range(PROBE_LENGTH))


@torch.no_grad()
def model_logprobs(model: torch.nn.Module, tokens: tuple[int, ...], dtype: torch.dtype,
                   device: torch.device | str = "cpu") -> list[float]:
    """log p(tokens[i] | tokens[:i]) for i >= 1 under `model`, a causal LM (under fsdp2 a collective: every rank
    calls it). Below float32 the forward runs under autocast to `dtype`, the served arithmetic; the log-softmax
    is taken in float32, as vLLM takes it."""
    device = torch.device(device)
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=ids).logits
    finally:
        model.train(was_training)
    logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()


async def served_logprobs(session: aiohttp.ClientSession, url: str, tokens: tuple[int, ...], model: str | None,
                          salt: str) -> list[float]:
    """The server's log-probs of the probe's tokens after the first, from the weights it serves `model` (a LoRA
    adapter; None: the base model) with. `salt` keeps the probe off KV cached under other weights: a push keeps
    the cache (pause with clear_cache=false)."""
    body: dict = {"token_ids": list(tokens), "cache_salt": salt,
                  "sampling_params": {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "logprobs": 0}}
    if model:
        body["model"] = model
    endpoint = f"{url}/inference/v1/generate"
    try:
        async with session.post(endpoint, json=body) as resp:
            if resp.status != 200:
                raise WeightSyncError(f"{endpoint}: HTTP {resp.status}: {(await resp.text())[:300]}")
            payload = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise WeightSyncError(f"{endpoint}: {exc!r}") from None
    return prompt_logprobs(payload, tokens)


def prompt_logprobs(payload: dict, tokens: tuple[int, ...]) -> list[float]:
    """The log-probs of `tokens[1:]` in a generate reply's `prompt_logprobs` (one entry per prompt token, the
    first null; each maps token ids, as strings, to {"logprob", ...})."""
    try:
        entries = payload["prompt_logprobs"]
        if len(entries) != len(tokens):
            raise ValueError(f"{len(entries)} prompt log-probs for {len(tokens)} tokens")
        return [float(entry[str(t)]["logprob"]) for entry, t in zip(entries[1:], tokens[1:])]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise WeightSyncError(f"malformed prompt log-probs in a generate reply: {exc!r}") from None
