"""In-process episodes for learner tests: the learner's own torch model samples, no vLLM.

Every turn of every active episode is one batched forward; the next token is drawn under the same temperature
and allowed-token mask vLLM applies, and its log-prob is recorded as the behaviour log-prob. Episodes are
assembled and flattened by the buffer's own code (buffer/store/episodes.py), so `Trainer.step` takes them as it takes
the buffer's batches. For tests of the learner alone: figures about learning come from `turnstream bench
learning`, which runs the real pipeline (this sampling once gave verdicts that did not carry over to it).
"""
from __future__ import annotations


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

    from turnstream.actors.envs.registry import make_env
    from turnstream.buffer.store.episodes import Episode
    from turnstream.protocol.messages import TurnChunk

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


def train_in_process(model_dir, env_name: str, env_args: dict, cfg, *, seed: int, batch: int, max_steps: int,
                     stop_at: float = 1.0) -> list[dict]:
    """Sample `batch` episodes, take one Trainer step, repeat (staleness 0); per step: success and stats.

    Stops after `max_steps` or once the mean success of the last three batches reaches `stop_at`."""
    import asyncio

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.buffer.store.episodes import flatten
    from turnstream.learner.step.trainer import Trainer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = Trainer(model, cfg, seed=seed, critic_path=str(model_dir))
    sampler = TorchSampler(model, 1.0, torch.Generator().manual_seed(seed))
    chat = ChatTokens(model_dir)
    history: list[dict] = []
    for step in range(max_steps):
        seeds = list(range(seed * 10_000_019 + step * batch, seed * 10_000_019 + (step + 1) * batch))
        model.eval()
        episodes, success = asyncio.run(play_batch(env_name, env_args, chat, sampler, seeds, trainer.version))
        stats = trainer.step(flatten(episodes, 1, trainer.version, 0))
        history.append({"success": float(np.mean(success)), **stats})
        if np.mean([h["success"] for h in history[-3:]]) >= stop_at and len(history) >= 3:
            break
    return history
