"""`turnstream bench learner --model-config NAME`: learner throughput and MFU at a named model size.

The model is built from a config alone (benchmarks/model_configs/NAME.json, Qwen2 shapes, random weights,
nothing downloaded) and trained by the real `Trainer.step` (packing, decoupled PPO loss, advantages,
AdamW) on synthetic multi-turn episodes packed into `--seq-len`-token micro-batches. Prints a summary,
then one JSON line: tokens/s, step seconds, peak memory and MFU.

MFU (model FLOPs utilisation) = model FLOPs per step / step seconds / peak FLOP/s, where the model FLOPs
of a step with T real (unpadded) tokens are, forward + backward = 3 x forward:
    6 * N_body * T                        dense layers: N_body = parameters of the decoder layers and the
                                          final norm (no embedding: a lookup; no LM head: counted next)
  + 6 * V * d * T_act                     LM head, run only at the T_act action positions (learner/batch/forward.py)
  + 6 * L * H * d_head * sum_i s_i^2      attention scores and values, causal (half of 2 x 2 s^2 per
                                          layer and head dim), per packed episode i of s_i tokens
Recomputation by activation checkpointing is not counted (this is MFU, not hardware FLOPs utilisation).
Peak: bf16 dense tensor-core FLOP/s by GPU name (H100/H200 989e12, A100 312e12, L40S 362e12); on a CPU,
or on an unknown GPU, MFU is null.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12}


def model_config(name: str):
    """A transformers Qwen2Config from benchmarks/model_configs/<name>.json (or a path to such a file)."""
    from transformers import Qwen2Config

    path = Path(name) if name.endswith(".json") else CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        from turnstream.core.configtools import ConfigError

        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
        raise ConfigError(f"--model-config: no model config {name!r} (known: {known})")
    data = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    data.pop("model_type", None)
    return Qwen2Config(**data)


def peak_flops(device) -> tuple[float | None, str]:
    import torch

    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16.items():
        if key in name.upper().replace("NVIDIA ", ""):
            return peak, name
    return None, name


def body_params(model) -> int:
    skip = {id(p) for p in model.get_input_embeddings().parameters()}
    skip |= {id(p) for p in model.get_output_embeddings().parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def step_flops(cfg, n_body: int, tokens: int, act_tokens: int, sum_sq: int) -> float:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = 6 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * sum_sq
    return 6 * n_body * tokens + 6 * cfg.vocab_size * cfg.hidden_size * act_tokens + attn


def synthetic_batch(vocab: int, seq_len: int, microbatches: int, group: int, seed: int):
    """Multi-turn episodes (observation 32..256 tokens, answer 8..128 whole-vocabulary tokens per turn) of
    seq_len/8 .. seq_len/2 tokens, about `microbatches` x seq_len tokens in all; prompts repeat `group` times."""
    import numpy as np

    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.protocol.messages import TurnChunk

    rng = np.random.default_rng(seed)
    eps, total = [], 0
    while total < microbatches * seq_len * 0.9:
        target = int(rng.integers(seq_len // 8, seq_len // 2 + 1))
        turns, n = [], 0
        while True:
            obs_n, gen_n = int(rng.integers(32, 257)), int(rng.integers(8, 129))
            if n + obs_n + gen_n > target:
                break
            turns.append((obs_n, gen_n))
            n += obs_n + gen_n
        turns = turns or [(target // 2, target - target // 2)]
        e = len(eps)
        ep = Episode(f"e{e}", ("bench", 0), f"p{e // group}")
        for t, (obs_n, gen_n) in enumerate(turns):
            last = t == len(turns) - 1
            ep.add(TurnChunk(actor_id="bench", epoch=0, seq=e * 1000 + t, episode_id=f"e{e}", turn=t,
                             prompt_key=ep.prompt_key, obs_tokens=rng.integers(10, vocab, obs_n).astype(np.int32),
                             gen_tokens=rng.integers(10, vocab, gen_n).astype(np.int32),
                             gen_logprobs=np.log(rng.uniform(0.05, 0.9, gen_n)).astype(np.float32),
                             gen_versions=np.zeros(gen_n, np.int32),
                             reward=float(rng.random() < 0.5) if last else 0.0, done=last,
                             allowed_tokens=np.zeros(0, np.int32)))
        eps.append(ep)
        total += ep.num_tokens
    return flatten(eps, request_id=1, learner_version=0, dropped_stale=0)


def run(args) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.learner.device import attn_implementation, placement
    from turnstream.learner.step.packing import microbatches
    from turnstream.learner.step.trainer import Trainer
    from turnstream.core.config import LearnerSection

    torch.set_num_threads(args.threads)
    where = placement(args.device, args.precision)
    cfg_model = model_config(args.model_config)
    attn = attn_implementation(args.attn, where.device) or "sdpa"
    torch.manual_seed(args.seed)
    with torch.device(where.device):  # initialise on the device: no host copy of a large model
        model = AutoModelForCausalLM.from_config(cfg_model, attn_implementation=attn, dtype=torch.float32)
    lc = LearnerSection(estimator=args.estimator, lr=1e-6, max_tokens_per_microbatch=args.seq_len,
                        activation_checkpointing=args.checkpointing, pack_sequences=True)
    trainer = Trainer(model, lc, seed=args.seed, where=where)
    batch = synthetic_batch(cfg_model.vocab_size, args.seq_len, args.microbatches, args.group, args.seed)
    lengths = np.diff(batch.episode_offsets)
    tokens, act_tokens = int(lengths.sum()), int(batch.action_mask.sum())
    n_body = body_params(model)
    flops = step_flops(cfg_model, n_body, tokens, act_tokens, int((lengths.astype(np.int64) ** 2).sum()))
    cuda = where.device.type == "cuda"
    trainer.step(batch)  # warm-up: allocator, kernel selection
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(where.device)
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        trainer.step(batch)  # ends in .item() reads: the device work is done when it returns
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    micro = len(microbatches(lengths, torch.arange(len(lengths)), args.seq_len, packed=True))
    step_s = statistics.median(times)
    peak, device_name = peak_flops(where.device)
    return {
        "model_config": args.model_config, "device": device_name, "precision": where.precision,
        "attn_implementation": model.config._attn_implementation, "activation_checkpointing": args.checkpointing,
        "params": sum(p.numel() for p in model.parameters()), "params_body": n_body,
        "seq_len": args.seq_len, "microbatches_per_step": micro, "episodes_per_step": len(lengths),
        "tokens_per_step": tokens, "action_tokens_per_step": act_tokens,
        "packing_efficiency": round(tokens / (micro * args.seq_len), 3),
        "steps": args.steps, "step_s": round(step_s, 4), "tokens_per_s": round(tokens / step_s, 1),
        "model_tflops_per_step": round(flops / 1e12, 3),
        "achieved_tflops": round(flops / step_s / 1e12, 2),
        "peak_tflops": None if peak is None else peak / 1e12,
        "mfu": None if peak is None else round(flops / step_s / peak, 4),
        # cuda: the allocator's peak; cpu: the process's peak resident set (includes the interpreter, libraries)
        "peak_memory_gib": round((torch.cuda.max_memory_allocated(where.device) if cuda else max_rss()) / 2**30, 3),
        "mfu_formula": "6*N_body*T + 6*V*d*T_act + 6*L*H*d_head*sum(s_i^2), fwd+bwd, causal attention",
    }


def max_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def add_arguments(p) -> None:
    p.add_argument("--model-config", default="", help="tiny, 0.5b, 1.5b (benchmarks/model_configs) or a .json path: "
                   "throughput/MFU mode")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda (MFU mode)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--seq-len", type=int, default=4096, help="packed tokens per micro-batch (MFU mode)")
    p.add_argument("--microbatches", type=int, default=8, help="about this many micro-batches per step (MFU mode)")
    p.add_argument("--group", type=int, default=4, help="episodes per prompt, for grpo (MFU mode)")
    p.add_argument("--estimator", default="grpo", help="learner.estimator (MFU mode)")
    p.add_argument("--checkpointing", action="store_true", help="learner.activation_checkpointing (MFU mode)")
    p.add_argument("--attn", default="auto", help="attention implementation (MFU mode)")


def main(args) -> int:
    result = run(args)
    mfu = "n/a" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
    print(f"{result['model_config']} on {result['device']} ({result['precision']}, {result['attn_implementation']}): "
          f"{result['tokens_per_s']:.0f} tokens/s, step {result['step_s']:.3f}s, "
          f"{result['achieved_tflops']} TFLOP/s, MFU {mfu}, peak memory {result['peak_memory_gib']} GiB")
    print(json.dumps(result))
    return 0
