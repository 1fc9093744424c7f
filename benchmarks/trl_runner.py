"""TRL's GRPOTrainer on a turnstream environment: the peer side of `turnstream bench trl`, one run per process.

Run as `python -m benchmarks.trl_runner --spec FILE` (a module, never a script path: this folder holds
benchmarks/trl.py, which would shadow the `trl` package). TRL cannot play a turnstream task through its own
multi-turn path as it stands: `environment_factory` exposes an environment's methods as tools, so the model
must write tool calls in a chat template that knows tools, where a turnstream task's action is a token or
two of plain text. So the episodes are played by a `rollout_func` (TRL's documented hook for custom
multi-turn rollouts) with transformers' `generate` (TRL's CPU path, no vLLM), through the same environment
class and the same chat-token path (ChatTokens) the actors use; the environment's turns are masked out of
the loss with `env_mask`. Every open episode's turn is sampled in one batched `generate`, and the turn's
environment steps are then awaited together (a slow tool's waits overlap) before the next turn is sampled.
Sampling applies the environment's action mask as the actors do; TRL's loss then takes log-probs over the whole
vocabulary, where turnstream's learner applies the mask too.

Every optimizer step appends one line to <out>/learner.jsonl with the keys turnstream's learner writes that
the benchmarks read (episodes, return_mean, tokens, action_tokens, step_s, time, ...), plus the generation
seconds and tokens and `first_sample_at`, the wall-clock time of the run's first `generate` call (the start of
its warm clock), so both systems' runs are read and summarised by the same code. The run stops itself
once the rolling success over `window` episodes reaches `target`, or after `max_steps` steps.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class TrlRunSpec:
    """One TRL run: the settings that have a twin in turnstream's config carry its name in the comment."""

    model: str  # model.path: the checkpoint and tokenizer both systems start from
    out: str  # learner.jsonl and TRL's output_dir go here
    env: str  # env.name
    env_args: dict = field(default_factory=dict)  # env.args
    seed: int = 0  # run.seed
    batch_episodes: int = 128  # buffer.batch_episodes: episodes per optimizer step
    group_size: int = 8  # TRL's num_generations (tasks.group_size of turnstream's group estimators)
    lr: float = 3e-4  # learner.lr
    warmup_steps: int = 0  # learner.warmup_steps: linear warm-up to lr
    max_grad_norm: float = 1.0  # learner.max_grad_norm
    temperature: float = 1.0  # actor.temperature
    max_new_tokens: int = 16  # actor.max_new_tokens (capped per turn by the environment's max_action_tokens)
    max_turns: int = 0  # actor.max_turns; 0: none
    max_context_tokens: int = 1024  # vllm.max_model_len: a turn that would not fit ends the episode, truncated
    window: int = 256  # run.rolling_episodes
    target: float = 0.9  # the rolling success that stops the run
    max_steps: int = 100_000  # optimizer steps at most (the caller's time cap stops it sooner)
    torch_threads: int = 0  # 0: torch's default (the CPUs the process may run on)
    bf16: bool = False  # learner.precision = bf16: bf16 autocast over fp32 master weights (TRL's `bf16`)


# ---- playing a batch of episodes ------------------------------------------------------------------------

class SampleClock:
    """The wall-clock time of the run's first generate call: where its warm clock starts."""

    def __init__(self):
        self.first: float | None = None

    def mark(self) -> None:
        if self.first is None:
            self.first = time.time()


@dataclass
class Played:
    """One episode in TRL's rollout terms: the first observation is the prompt, the rest is the completion."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1: a sampled token, 0: the environment's
    logprobs: list[float] = field(default_factory=list)  # of the sampled tokens (0 on the environment's)
    episode_return: float = 0.0
    success: bool = False


class ActionMask:
    """A logits processor that keeps only the allowed token ids, as vLLM's allowed_token_ids does for actors."""

    def __init__(self, allowed: list[int]):
        self.allowed = allowed

    def __call__(self, input_ids, scores):
        import torch

        masked = torch.full_like(scores, float("-inf"))
        masked[:, self.allowed] = scores[:, self.allowed]
        return masked


def sample_turn(model, contexts: list[list[int]], max_tokens: int, allowed: list[int], eos_id: int, pad_id: int,
                temperature: float) -> list[tuple[list[int], list[float]]]:
    """One reply per context with transformers' generate (left-padded batch); the tokens up to and including the
    first end-of-turn, with their log-probs under the distribution that sampled them."""
    import torch
    from transformers import LogitsProcessorList

    width = max(map(len, contexts))
    ids = torch.tensor([[pad_id] * (width - len(c)) + c for c in contexts])
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    processors = LogitsProcessorList([ActionMask(allowed)] if allowed else [])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attention, do_sample=True, temperature=temperature,
                             top_k=0, top_p=1.0, max_new_tokens=max_tokens, logits_processor=processors,
                             eos_token_id=eos_id, pad_token_id=pad_id, output_scores=True,
                             return_dict_in_generate=True)
    new = out.sequences[:, width:]
    # scores are after the processors and the temperature: the sampling distribution
    logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
    taken = logps.gather(2, new.unsqueeze(-1)).squeeze(-1)
    replies = []
    for row, lp in zip(new.tolist(), taken.tolist()):
        n = row.index(eos_id) + 1 if eos_id in row else len(row)
        replies.append((row[:n], lp[:n]))
    return replies


async def play_batch(model, chat, make_env, seeds: list[int], spec: TrlRunSpec,
                     clock: SampleClock | None = None) -> list[Played]:
    """Play one episode per seed, every open episode's turn sampled in one batch and the turn's environment
    steps awaited together; the environment steps and the chat tokens are the actors' (actors/play/env_loop.py)."""
    envs = [make_env() for _ in seeds]
    played, contexts = [], []
    for reset in await asyncio.gather(*(env.reset(seed) for env, seed in zip(envs, seeds))):
        first = chat.first_turn(reset.observation, reset.system)
        played.append(Played(prompt_ids=first))
        contexts.append(list(first))
    env0 = envs[0]
    allowed = [chat.single_token_id(a) for a in env0.action_tokens] if env0.action_tokens else []
    max_tokens = min(spec.max_new_tokens, env0.max_action_tokens)
    open_ = [i for i in range(len(seeds)) if len(contexts[i]) + max_tokens <= spec.max_context_tokens]
    turn = 0
    while open_ and not (spec.max_turns and turn >= spec.max_turns):
        if clock is not None:
            clock.mark()
        replies = sample_turn(model, [contexts[i] for i in open_], max_tokens, allowed, chat.end_of_turn_id,
                              pad_id=chat.end_of_turn_id, temperature=spec.temperature)
        steps = await asyncio.gather(*(envs[i].step(chat.decode(ids)) for i, (ids, _) in zip(open_, replies)))
        still = []
        for i, (ids, lps), step in zip(open_, replies, steps):
            p = played[i]
            p.completion_ids += ids
            p.env_mask += [1] * len(ids)
            p.logprobs += lps
            contexts[i] += ids
            p.episode_return += step.reward
            if step.done:
                p.success = bool((step.info or {}).get("success", step.reward > 0))
                continue
            obs = chat.next_turn(step.observation, ids)
            if len(contexts[i]) + len(obs) + max_tokens > spec.max_context_tokens:
                continue  # truncated: the next turn would not fit, as an actor truncates it
            p.completion_ids += obs
            p.env_mask += [0] * len(obs)
            p.logprobs += [0.0] * len(obs)
            contexts[i] += obs
            still.append(i)
        open_ = still
        turn += 1
    await asyncio.gather(*(env.close() for env in envs))
    return played


# ---- the run ---------------------------------------------------------------------------------------------

class StepLog:
    """learner.jsonl in turnstream's keys: the rollout fills in what it played, the trainer's callback the rest."""

    def __init__(self, path: Path, spec: TrlRunSpec):
        self.path, self.spec = path, spec
        self.path.write_text("")
        self.pending: dict = {}
        self.successes: list[bool] = []
        self.step = 0
        self.clock = SampleClock()

    def rollout(self, played: list[Played], started: float, gen_s: float) -> None:
        self.successes += [p.success for p in played]
        self.pending = {
            "episodes": len(played), "return_mean": sum(p.episode_return for p in played) / len(played),
            "success_mean": sum(p.success for p in played) / len(played),
            "tokens": sum(len(p.prompt_ids) + len(p.completion_ids) for p in played),
            "action_tokens": sum(sum(p.env_mask) for p in played), "step_started": started, "gen_s": gen_s,
            "first_sample_at": self.clock.first}

    def step_end(self, logs: dict) -> bool:
        """Write the finished step; True once the rolling success reached the target."""
        now = time.time()
        self.step += 1
        record = {**self.pending, "version": self.step, "entropy": logs.get("entropy", float("nan")),
                  "time": now, "wall_s": now - self.pending["step_started"]}
        # the learner's share of the step: all of it but the rollout
        record["step_s"] = record["wall_s"] - record["gen_s"]
        record["tokens_per_s"] = record["tokens"] / max(record["step_s"], 1e-9)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        recent = self.successes[-self.spec.window:]
        return len(self.successes) >= self.spec.window and sum(recent) / len(recent) >= self.spec.target


def run(spec: TrlRunSpec) -> Path:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.actors.envs.registry import make_env as make_registered

    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    chat = ChatTokens(spec.model)

    def make_env():
        return make_registered(spec.env, **spec.env_args)

    log = StepLog(out / "learner.jsonl", spec)
    prompts_per_step = spec.batch_episodes // spec.group_size
    # each prompt is an environment seed: the rollout resets the environment with it (the seeds of a run
    # differ with run.seed as the actors' do; a group's members share one)
    first_seed = spec.seed * 1_000_003
    data = datasets.Dataset.from_dict(
        {"prompt": [str(first_seed + i) for i in range(prompts_per_step * min(spec.max_steps, 10_000))]})

    def rollout_func(prompts: list, trainer) -> dict:
        started = time.time()
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        played = asyncio.run(play_batch(model, chat, make_env, [int(p) for p in prompts], spec, log.clock))
        model.train(was_training)
        log.rollout(played, started, time.time() - started)
        return {"prompt_ids": [p.prompt_ids for p in played], "completion_ids": [p.completion_ids for p in played],
                "logprobs": [p.logprobs for p in played], "env_mask": [p.env_mask for p in played],
                "episode_return": [p.episode_return for p in played]}

    def episode_return(prompts, completions, episode_return, **_) -> list[float]:
        return list(episode_return)

    class Stop(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None and "loss" in logs and log.step_end(logs):
                control.should_training_stop = True

    config = GRPOConfig(
        output_dir=str(out / "trl"), use_cpu=True, seed=spec.seed, bf16=spec.bf16,
        per_device_train_batch_size=spec.batch_episodes, gradient_accumulation_steps=1,
        num_generations=spec.group_size, learning_rate=spec.lr, lr_scheduler_type="constant_with_warmup",
        warmup_steps=spec.warmup_steps, max_grad_norm=spec.max_grad_norm, temperature=spec.temperature,
        max_steps=spec.max_steps, logging_steps=1, save_strategy="no", report_to="none",
        dataloader_num_workers=0, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(spec.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec.model)
    trainer = GRPOTrainer(model=model, reward_funcs=[episode_return], args=config, train_dataset=data,
                          processing_class=tokenizer, rollout_func=rollout_func, callbacks=[Stop()])
    trainer.train()
    return log.path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.trl_runner", description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="a JSON file of TrlRunSpec's fields")
    args = p.parse_args(argv)
    spec = TrlRunSpec(**json.loads(Path(args.spec).read_text()))
    print(run(spec), flush=True)
    return 0


def write_spec(spec: TrlRunSpec, path: Path) -> Path:
    path.write_text(json.dumps(asdict(spec), indent=1) + "\n")
    return path


if __name__ == "__main__":
    raise SystemExit(main())
