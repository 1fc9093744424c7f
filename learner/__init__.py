"""Learner role: advantages, off-policy-corrected PPO, weight pushes into running vLLM servers.

Where things live:
- main.py (the process: build a Trainer, resume it), serve.py (rank 0: batches in, versions out), events.py
  (what the loop tells its helpers) and listeners.py (the helpers that hear it, chosen at start-up),
  rank_commands.py (what rank 0 tells the other ranks), batch_client.py, metrics.py, trackers.py;
  device.py (device and precision), lora.py (LoRA adapters on the policy);
- batch/ (a batch as tensors, a micro-batch's forward: what the step, the estimators and the probe read),
  step/ (one learner step: the Trainer and what it is made of), estimators/ (advantages, SPO tracker,
  critic), parallel/ (one process, DDP, FSDP2), sync/ (weight pushes into vLLM), weights/ (the policy's
  weights for a push or an export: buckets, safetensors files), checkpoint/ (save, restore, export), record/
  (every step's batch and RNG state, for `turnstream replay` and `inspect`).
"""
