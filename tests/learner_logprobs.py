"""Action log-probs of a TensorBatch through the learner's own path, for tests that check them against vLLM's
or against their definition: learner/batch/forward.py's padded micro-batch (a row per context), the logits at the
action positions, and the trainer's masked, temperature-scaled, truncated log-softmax (learner/batch/tensors.py)."""
from __future__ import annotations


def action_logprobs(model, tb, rows=None, device="cpu"):
    """(log-probs, entropies) of the action tokens of `rows` (default: every episode), in flat action order."""
    import torch

    from turnstream.learner.batch import forward
    from turnstream.learner.batch.tensors import logprobs_from_action_logits

    mb = forward.build(tb, torch.arange(tb.num_episodes) if rows is None else rows, packed=False, device=device)
    logits = forward.action_logits(model, mb).logits
    temperature, mask_id, tokens = forward.sampling_params(tb, mb.select, device)
    return logprobs_from_action_logits(logits, temperature, mask_id, tb.allowed.to(device), tokens,
                                       forward.truncation(tb, mb.select, device))
