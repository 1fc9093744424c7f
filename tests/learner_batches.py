"""Synthetic learner batches for the learner tests: multi-turn episodes flattened by the buffer's code."""
from __future__ import annotations

import numpy as np

from turnstream.buffer.store.episodes import Episode, flatten
from turnstream.protocol.messages import Batch, TurnChunk


def synthetic_batch(n_episodes: int = 8, *, vocab: int = 64, turns=(2, 3, 4), seed: int = 0, allowed=(5, 6),
                    gen_len=(1,), group: int = 1, learner_version: int = 2) -> Batch:
    """Episodes of varying turn counts; prompt keys repeat `group` times (for grpo/rloo)."""
    rng = np.random.default_rng(seed)
    episodes = []
    for e in range(n_episodes):
        ep = Episode(f"e{e}", ("a", 0), f"p{e // group}")
        k = int(rng.choice(turns))
        for t in range(k):
            n_obs, n_gen = int(rng.integers(2, 6)), int(rng.choice(gen_len))
            gen = rng.choice(allowed, n_gen) if allowed else rng.integers(1, vocab, n_gen)
            ep.add(TurnChunk(actor_id="a", epoch=0, seq=e * 100 + t, episode_id=f"e{e}", turn=t,
                             prompt_key=ep.prompt_key, obs_tokens=rng.integers(1, vocab, n_obs).astype(np.int32),
                             gen_tokens=np.asarray(gen, np.int32),
                             gen_logprobs=np.log(rng.uniform(0.3, 0.7, n_gen)).astype(np.float32),
                             gen_versions=rng.integers(max(0, learner_version - 2), learner_version + 1,
                                                       n_gen).astype(np.int32),
                             reward=float(rng.random() < 0.5) if t == k - 1 else 0.0, done=t == k - 1,
                             allowed_tokens=np.asarray(allowed, np.int32)))
        episodes.append(ep)
    return flatten(episodes, request_id=1, learner_version=learner_version, dropped_stale=0)


def tiny_causal_lm(vocab: int = 64, seed: int = 0, hidden: int = 32):
    """A 1-layer Qwen2 small enough for unit tests (fp32, eager attention for reproducibility)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=hidden // 2,
                      max_position_embeddings=256, pad_token_id=0, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    return Qwen2ForCausalLM(cfg).to(torch.float32)


def llm_sized_checkpoint(path) -> int:
    """A random Qwen2 just past the pretrained scale (4 layers, 512 wide), saved to `path` with room for 4096
    positions (so that a context limit shows the micro-batch budget); returns its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                         pad_token_id=0, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def params_after_steps(cfg, steps: int = 2, n_episodes: int = 12, seed: int = 0, critic_path: str = ""):
    """Train a fresh tiny model on fixed synthetic batches; returns the flat parameter vector."""
    import torch

    from turnstream.learner.step.trainer import Trainer

    model = tiny_causal_lm(seed=seed)
    trainer = Trainer(model, cfg, seed=seed, critic_path=critic_path)
    for s in range(steps):
        trainer.step(synthetic_batch(n_episodes, group=4, seed=100 + s))
    return torch.cat([p.detach().reshape(-1) for p in trainer._params()])


def dp_worker(rank: int, world: int, init_file: str, cfg, out_dir: str, critic_path: str = "") -> None:
    """One data-parallel rank (gloo, CPU) for the multi-rank test: same batches, its share of micro-batches."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        flat = params_after_steps(cfg, critic_path=critic_path)
        torch.save(flat, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def recorded_learner_life(cfg, batches: dict[int, int], stop_after: int) -> None:
    """One learner process's life with learner.record on: resume, record and train `batches` (version -> batch
    seed), checkpoint every `checkpoint_every` steps, and stop after step `stop_after` (a kill, where that step
    is not a checkpoint's)."""
    import json

    from turnstream.learner.main import build_trainer, start_rank
    from turnstream.learner.rank_commands import save_checkpoint
    from turnstream.learner.record.writer import StepRecorder, generator_state

    start_rank(cfg)  # threads and seed, as a learner process
    _, trainer, resumed_from = build_trainer(cfg)
    recorder = StepRecorder.start(cfg, trainer.version, 1, resumed_from)
    while trainer.version < stop_after:
        version = trainer.version + 1
        batch = synthetic_batch(12, group=4, seed=batches[version], learner_version=trainer.version)
        before = generator_state(trainer.generator)
        stats = trainer.step(batch)
        recorder.write_step(trainer.version, batch, before, stats["step_s"])
        with (cfg.run_dir / "learner.jsonl").open("a") as f:
            f.write(json.dumps(stats) + "\n")
        if trainer.version % cfg.learner.checkpoint_every == 0:
            save_checkpoint(cfg, trainer)


def init_from_counts(tracker, key: str, successes: int, n: int) -> None:
    """An SPO tracker's offline initialisation from counts (docs/estimators.md, "SPO"):
    v0 = (s + 0.5)/(n + 1) with N_init = 1/(1 - rho_min) pseudo-counts; n = 0: the Jeffreys prior."""
    n_init = 1.0 / (1.0 - tracker.rho_min)
    if n == 0:
        tracker.state[key] = (0.5, 0.5)
    else:
        tracker.state[key] = (n_init * (successes + 0.5) / (n + 1), n_init * (n - successes + 0.5) / (n + 1))
