"""`turnstream bench learner`: learner tokens/s against a bare torch forward/backward loop on the same batch.

Both sides get the same model (the tiny Qwen2 of the demo unless --model), the same multi-turn batch, the
same micro-batches (learner/step/packing.py) and one AdamW step per batch. The bare loop is the floor of what
any learner must do: one forward, a log-softmax at the action positions, one backward, one optimizer
step. The learner additionally applies temperature and allowed-token masks, computes advantages and the
decoupled PPO loss, and measures step_kl with a no-grad forward over 32 episodes at the new weights;
`spo_updated` (learner.spo.drift = "updated") makes that forward over every episode (the tracker's drift D
needs them all), and the value-based estimators read the critic's values before the update: one more
no-grad forward pass. `turn_gae_microbatch` (learner.critic.whiten = "microbatch") takes
the values from the training forward instead, whitening each micro-batch's advantages on its own.
Prints a table, then one JSON line.

With `--model-config NAME` (tiny, 0.5b, 1.5b) it measures tokens/s, peak memory and MFU instead, on
`--device` (benchmarks/learner_mfu.py; the MFU formula is stated there and in BENCHMARKS.md). With `--parallel` it
compares learner.parallel = ddp and fsdp2 over `--ranks` torchrun ranks: bytes per rank and tokens/s
(benchmarks/learner_parallel.py). With `--context-turns K` it times a turn_gae step on `--turns`-turn episodes whose
context restarts every K turns (actor.context_turns), one row per context, against one row per episode. With
`--long-tail` it times a step of the default learner on episodes of follow_signs_longtail's long-tailed lengths with
the whole batch in one padded micro-batch (max_tokens_per_microbatch = 0) against the policy's "auto" budget.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def _recorded_batch(run_dir: str):
    """A batch a run's learner trained on (learner.record): of its recorded steps, the one of median size in tokens,
    so real prompts, chat templates and replies are timed rather than synthetic ones."""
    from turnstream.learner.record.reader import RecordError, open_record

    try:
        steps = sorted((s for s in open_record(run_dir).steps() if not s.lost), key=lambda s: s.batch.tokens.size)
    except RecordError as exc:
        raise SystemExit(f"turnstream bench learner: --record: {exc}") from None
    if not steps:
        raise SystemExit(f"--record {run_dir}: no recorded step (run it with learner.record = true)")
    chosen = steps[len(steps) // 2]
    print(f"the batch of version {chosen.version} of {run_dir}: {len(chosen.batch.episode_ids)} episodes, "
          f"{chosen.batch.tokens.size} tokens")
    return chosen.batch


def _batch(tokenizer_vocab: int, episodes: int, seed: int, turns: int = 0, context_turns: int = 0,
           long_tail: bool = False):
    """`turns`: every episode that long (0: 2 to 6 turns, as follow_signs); `context_turns`: its context restarts
    every that many turns, as with actor.context_turns (a restarted turn's observation is a whole prompt);
    `long_tail`: 2 to 4 junctions and follow_signs_longtail's corridor turns (median 4 turns, a few up to 28)."""
    import random

    import numpy as np

    from turnstream.actors.envs.tasks.follow_signs_longtail import corridor_length
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.protocol.messages import TurnChunk

    rng = np.random.default_rng(seed)
    allowed = np.array([5, 6], np.int32)
    eps = []
    for e in range(episodes):
        ep = Episode(f"e{e}", ("bench", 0), f"p{e}")
        k = turns or int(rng.integers(2, 7))  # variable-length episodes: 2 to 6 turns, as follow_signs
        if long_tail:
            k = int(rng.integers(2, 5)) + corridor_length(random.Random(seed * episodes + e), 0.5, 1.0, 24)
        for t in range(k):
            obs = rng.integers(10, tokenizer_vocab, int(rng.integers(8, 15))).astype(np.int32)
            ep.add(TurnChunk(actor_id="bench", epoch=0, seq=e * k + t, episode_id=f"e{e}", turn=t,
                             prompt_key=f"p{e % 16}", obs_tokens=obs, gen_tokens=rng.choice(allowed, 1),
                             gen_logprobs=np.full(1, np.log(0.5), np.float32), gen_versions=np.zeros(1, np.int32),
                             reward=float(rng.random() < 0.3) if t == k - 1 else 0.0, done=t == k - 1,
                             allowed_tokens=allowed, context_reset=bool(context_turns) and t % context_turns == 0))
        eps.append(ep)
    return flatten(eps, request_id=1, learner_version=0, dropped_stale=0)


class BareLoop:
    """Forward + action log-softmax + backward + AdamW over the same micro-batches: the floor of any learner.

    Same rows (packed or padded, as the learner chose) and action-position-only LM head as the learner
    (learner/batch/forward.py)."""

    def __init__(self, model, batch, budget: int, lr: float, where, packed: bool):
        import torch

        from turnstream.learner.batch import forward
        from turnstream.learner.batch.tensors import to_tensors
        from turnstream.learner.step.packing import microbatches

        self.where, self.model = where, model.to(where.device)
        self.tb = to_tensors(batch, model.config.vocab_size)
        groups = microbatches(self.tb.lengths, torch.arange(self.tb.num_episodes), budget, packed=packed)
        self.micro = [forward.build(self.tb, g, packed, where.device) for g in groups]
        self.tokens = [self.tb.act_tokens[mb.select, None].to(where.device) for mb in self.micro]
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=where.device.type == "cuda")

    def step(self) -> float:
        import torch

        from turnstream.learner.batch.forward import action_logits

        tb = self.tb
        started = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        for mb, tokens in zip(self.micro, self.tokens):
            with self.where.autocast():
                logits = action_logits(self.model, mb).logits
            logp = torch.log_softmax(logits.float(), -1).gather(1, tokens).squeeze(1)
            (-logp.sum() / tb.act_tokens.numel()).backward()
        float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))  # read, as the learner does
        self.opt.step()
        if self.where.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started


def _context_rows(args, fresh, vocab: int) -> int:
    """Step time of one row per restarted context against one row per episode (the layout without restarts,
    whose attention costs what a block-diagonal mask over the episode costs), interleaved."""
    import dataclasses

    import numpy as np

    from turnstream.core.config import LearnerSection
    from turnstream.learner.step.trainer import Trainer

    batch = _batch(vocab, args.episodes, args.seed, args.turns, args.context_turns)
    whole = dataclasses.replace(batch, context_starts=np.zeros(0, np.int64))
    cfg = LearnerSection(estimator="turn_gae", max_tokens_per_microbatch=args.max_tokens_per_microbatch,
                         pack_sequences=False)
    trainers = {name: Trainer(fresh(), cfg, seed=args.seed) for name in ("contexts", "episodes")}
    batches = {"contexts": batch, "episodes": whole}
    times = {name: [] for name in trainers}
    for i in range(args.steps + 1):
        for name, trainer in trainers.items():
            started = time.perf_counter()
            trainer.step(batches[name])
            if i:  # the first is a warm-up
                times[name].append(time.perf_counter() - started)
    per_context, per_episode = (statistics.median(times[n]) for n in ("contexts", "episodes"))
    print(f"{args.episodes} episodes of {args.turns} turns, a context every {args.context_turns}: "
          f"{batch.tokens.size} tokens; step {per_context:.2f} s with a row per context, "
          f"{per_episode:.2f} s with a row per episode")
    print(json.dumps({"tokens_per_batch": int(batch.tokens.size), "context_rows_step_s": round(per_context, 3),
                      "episode_rows_step_s": round(per_episode, 3),
                      "context_rows_speedup": round(per_episode / per_context, 2)}))
    return 0


def _long_tail(args, fresh, vocab: int) -> int:
    """A spo step on long-tailed episodes: one padded micro-batch against the "auto" budget, interleaved."""
    from turnstream.core.config import LearnerSection
    from turnstream.learner.step.trainer import Trainer

    batch = _batch(vocab, args.episodes, args.seed, long_tail=True)
    trainers = {budget: Trainer(fresh(), LearnerSection(max_tokens_per_microbatch=budget), seed=args.seed)
                for budget in (0, "auto")}
    times = {budget: [] for budget in trainers}
    for i in range(args.steps + 1):
        for budget, trainer in trainers.items():
            started = time.perf_counter()
            trainer.step(batch)
            if i:  # the first is a warm-up
                times[budget].append(time.perf_counter() - started)
    whole, auto = (statistics.median(times[b]) for b in (0, "auto"))
    budget = trainers["auto"].cfg.max_tokens_per_microbatch
    longest = int((batch.episode_offsets[1:] - batch.episode_offsets[:-1]).max())
    print(f"{args.episodes} episodes, {batch.tokens.size} tokens, the longest {longest}: step {whole:.2f} s in one "
          f"micro-batch, {auto:.2f} s under the auto budget of {budget}")
    print(json.dumps({"tokens_per_batch": int(batch.tokens.size), "longest_episode": longest,
                      "one_microbatch_step_s": round(whole, 3), "auto_budget_step_s": round(auto, 3),
                      "auto_budget": budget, "speedup": round(whole / auto, 2)}))
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="turnstream bench learner", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="", help="HF checkpoint directory (default: build the tiny model)")
    p.add_argument("--record", default="", metavar="RUN_DIR",
                   help="time a batch this run trained on (learner.record; the model must be --model's) instead of "
                   "a synthetic one")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--steps", type=int, default=7, help="timed step pairs per estimator (medians are reported)")
    p.add_argument("--estimators", default="spo,spo_updated,grpo,turn_gae,turn_gae_microbatch",
                   help="spo_updated: spo with learner.spo.drift = updated; turn_gae_microbatch: turn_gae with "
                        "learner.critic.whiten = microbatch (values from the training forward)")
    p.add_argument("--max-tokens-per-microbatch", type=int, default=2048)
    p.add_argument("--pack-sequences", choices=["auto", "true", "false"], default="auto",
                   help="learner.pack_sequences for both sides (auto: packed rows only with flash/flex attention)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context-turns", type=int, default=0,
                   help="time a turn_gae step on --turns-turn episodes whose context restarts every K turns (padded: "
                   "one row per context) against the same batch as one row per episode")
    p.add_argument("--turns", type=int, default=60, help="turns per episode with --context-turns")
    p.add_argument("--long-tail", action="store_true",
                   help="time a spo step on long-tailed episode lengths in one padded micro-batch against the auto "
                   "budget")
    from benchmarks import learner_mfu, learner_parallel

    learner_mfu.add_arguments(p)
    learner_parallel.add_arguments(p)
    args = p.parse_args(argv)
    if args.parallel:  # ddp against fsdp2 under torchrun (benchmarks/learner_parallel.py)
        return learner_parallel.main(args)
    if args.model_config:  # throughput and MFU at a named model size (benchmarks/learner_mfu.py)
        return learner_mfu.main(args)

    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.learner.device import placement
    from turnstream.learner.step.trainer import Trainer
    from turnstream.core.config import LearnerSection
    from turnstream.tiny_model import make_tiny_model

    torch.set_num_threads(args.threads)
    model_dir = args.model or make_tiny_model(tempfile.mkdtemp(prefix="bench-learner-"), seed=0)

    def fresh():
        torch.manual_seed(args.seed)
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    vocab = fresh().config.vocab_size
    if args.context_turns:
        return _context_rows(args, fresh, vocab)
    if args.long_tail:
        return _long_tail(args, fresh, vocab)
    batch = _recorded_batch(args.record) if args.record else _batch(vocab, args.episodes, args.seed)
    tokens = int(batch.tokens.size)
    rows, result = [], {"tokens_per_batch": tokens, "episodes": len(batch.episode_ids), "threads": args.threads,
                        "pack_sequences": args.pack_sequences}
    bare_all = []
    for name in args.estimators.split(","):
        cfg = LearnerSection(estimator=name.removesuffix("_updated").removesuffix("_microbatch"),
                             device=args.device, precision=args.precision,
                             max_tokens_per_microbatch=args.max_tokens_per_microbatch,
                             pack_sequences={"true": True, "false": False}.get(args.pack_sequences, "auto"))
        if name == "spo_updated":  # SPO with the drift D re-read after the update: one more forward pass
            cfg.spo.drift = "updated"
        if name.endswith("_microbatch"):  # no value pass: advantages whitened per micro-batch
            cfg.critic.whiten = "microbatch"
        trainer = Trainer(fresh(), cfg, seed=args.seed, critic_path=str(model_dir))
        bare = BareLoop(fresh(), batch, args.max_tokens_per_microbatch, trainer.cfg.lr,
                        placement(args.device, args.precision), packed=trainer.packed)
        bare.step(), trainer.step(batch)  # warm-up (allocator, kernels)
        # Interleave the two sides so both see the same machine load; the median pair ratio is reported.
        pairs = []
        for _ in range(args.steps):
            b = bare.step()
            started = time.perf_counter()
            trainer.step(batch)
            pairs.append((b, time.perf_counter() - started))
        bare_s = statistics.median(b for b, _ in pairs)
        step_s = statistics.median(t for _, t in pairs)
        ratio = statistics.median(b / t for b, t in pairs)
        bare_all.append(bare_s)
        rows.append((name, tokens / step_s, ratio))
        result[f"{name}_tokens_per_s"] = round(tokens / step_s, 1)
        result[f"{name}_ratio"] = round(ratio, 3)
    bare_s = statistics.median(bare_all)
    result["bare_tokens_per_s"] = round(tokens / bare_s, 1)
    print(f"{'side':<20}{'tokens/s':>12}{'ratio':>8}")
    print(f"{'bare torch':<20}{tokens / bare_s:>12.0f}{1.0:>8.2f}")
    for name, tps, ratio in rows:
        print(f"{name:<20}{tps:>12.0f}{ratio:>8.2f}")
    result["target_ratio"] = 0.8
    print(json.dumps(result))
    return 0
