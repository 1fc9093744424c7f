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

from turnstream.learner.batch.forward import MicroBatch
from turnstream.learner.sync.server_calls import WeightSyncError

PROBE_LENGTH = 16
# Ids below this are ordinary tokens in any real tokenizer; above it some reserve special or padding ids that a
# server may refuse in a prompt (a vocabulary padded past its tokenizer's last id).
ORDINARY_IDS = 32000


def probe_tokens(vocab_size: int) -> tuple[int, ...]:
    """The fixed probe: PROBE_LENGTH ids spread over the ordinary part of the vocabulary (a prime stride)."""
    n = min(vocab_size, ORDINARY_IDS)
    return tuple((3 + 7919 * i) % n for i in range(PROBE_LENGTH))


def probe_batch(tokens: tuple[int, ...], device: torch.device | str = "cpu") -> MicroBatch:
    """The probe as the learner's forward takes it (learner/batch/forward.py): one padded row, every token after
    the first an "action", scored by the logits at the position before it."""
    n = len(tokens)
    at = torch.arange(n - 1)
    return MicroBatch(rows=torch.zeros(1, dtype=torch.long), select=torch.ones(n - 1, dtype=torch.bool),
                      input_ids=torch.tensor([tokens], dtype=torch.long, device=device),
                      position_ids=torch.arange(n, device=device)[None],
                      act_index=torch.stack([torch.zeros_like(at), at]).to(device), tokens=n, packed=False,
                      cut_rows=torch.zeros(0, dtype=torch.long), cut_index=torch.zeros((2, 0), dtype=torch.long,
                                                                                    device=device))


@torch.no_grad()
def model_logprobs(net: torch.nn.Module, tokens: tuple[int, ...], dtype: torch.dtype,
                   device: torch.device | str = "cpu") -> list[float]:
    """log p(tokens[i] | tokens[:i]) for i >= 1 under the policy of `net`, the learner's network
    (learner/estimators/critic.py: a MicroBatch in, logits at its actions out). Under fsdp2 it is the root
    module, through which every forward must go, and the forward is a collective: every rank calls this.
    Below float32 the forward runs under autocast to `dtype`, the served arithmetic; the log-softmax is taken
    in float32, as vLLM takes it."""
    device = torch.device(device)
    mb = probe_batch(tokens, device)
    was_training = net.training
    net.eval()
    try:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = net(mb)[0]
    finally:
        net.train(was_training)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, mb.input_ids[0, 1:, None]).squeeze(-1).tolist()


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
