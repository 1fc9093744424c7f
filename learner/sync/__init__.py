"""Weight sync: push the learner's weights into running vLLM servers without stopping generation.

One interface, `WeightSync` (base.py): every push pauses the servers with `pause?mode=keep&clear_cache=false`
(running requests stay in flight and continue on the new weights; vLLM's per-token version spans record the
switch), transfers, labels the new version and resumes (always, in `finally`), on all servers in parallel.
The backends differ only in the transfer, and one is chosen once, from the config (factory.py):
- disk.py: safetensors into a shared directory, then `/collective_rpc reload_weights`; works on CPU and across
  hosts with a shared filesystem (`[vllm.weight_sync] backend = "disk"`);
- nccl.py: vLLM's native weight-transfer engine, a broadcast from the learner (rank 0) to every server's
  workers (`backend = "nccl"` with `master_address` and `master_port`);
- lora.py: with `[learner.lora]` pushing adapters, the adapters alone, loaded by every server as a LoRA
  adapter, whatever backend full weights use.
What a push carries is learner/weights/'s: the policy's tensors, LoRA's adapters or merged weights (source.py),
read bucket by bucket (buckets.py, `learner.push_bucket_mb`) and written as safetensors files (files.py).
learner/WEIGHT_SYNC.md describes the whole.

After a push, verify.py checks that each server serves the pushed weights (probe.py: a fixed probe's log-probs,
the server's against the learner's); one that does not is relabelled outside the staleness bound, so actors skip
it, and re-synced until a push verifies it (`[vllm.weight_sync] verify_every`, `verify_tolerance`).

A server that fails during a push (down, restarting) is remembered as behind. Every push goes to every
server, so the next push brings it back; between pushes `resync()` (run by `watch()` in the background)
brings it to the latest version as soon as it answers `/health` again. Actors do not send it requests
while its version is outside the staleness bound (actors/inference/fleet.py).

Used by learner/serve.py: `save(weights, version) -> path`, `await push(path, version, expected)`,
`await set_version(version)`; `weights` is a WeightBuckets source (a state dict as it is: `WeightBuckets(state,
None)`), which every backend reads the same way.
"""
