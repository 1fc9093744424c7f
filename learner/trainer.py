"""One learner step: recompute pi_prox, SPO advantages, decoupled PPO update, then feed the tracker."""
from __future__ import annotations

import time

import numpy as np
import torch

from learner.batching import TensorBatch, action_logprobs, to_tensors
from learner.loss import decoupled_ppo_loss
from learner.spo import SpoConfig, SpoTracker, normalize_advantages
from protocol.messages import Batch
from turnstream.config import LearnerSection


class Trainer:
    def __init__(self, model, cfg: LearnerSection, seed: int = 0):
        self.model = model
        self.cfg = cfg
        self.vocab_size = model.config.vocab_size
        self.pad_id = model.config.pad_token_id or 0
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        # Early Adam steps are close to sign descent (one-sample second moments); a warm-up keeps those
        # noisy steps small, which matters for RL where the first batches' gradients are mostly noise.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / max(1, cfg.warmup_steps)))
        self.tracker = SpoTracker(SpoConfig(cfg.spo.rho_min, cfg.spo.rho_max, cfg.spo.d_half))
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0

    def step(self, batch: Batch) -> dict:
        started = time.monotonic()
        tb = to_tensors(batch, self.vocab_size, self.pad_id)
        self.model.eval()  # no dropout: pi_prox and pi_theta must be the same function at equal weights
        with torch.no_grad():
            prox_logp, _ = action_logprobs(self.model, tb)

        returns = np.asarray(batch.returns, np.float64)
        baselines = np.array([self.tracker.value(k) for k in batch.prompt_keys])  # read before the update
        episode_adv = normalize_advantages(returns - baselines, tb.tokens_per_episode, self.cfg.spo.normalize)
        token_adv = torch.from_numpy(episode_adv[tb.act_episode.numpy()].astype(np.float32))

        stats: dict[str, list[float]] = {}
        for _ in range(self.cfg.epochs):
            for rows in torch.randperm(tb.num_episodes, generator=self.generator).chunk(self.cfg.minibatches):
                select = torch.isin(tb.act_episode, rows)
                logp, entropy = action_logprobs(self.model, tb, rows)
                loss, s = decoupled_ppo_loss(logp, prox_logp[select], tb.behav_logp[select], token_adv[select],
                                             clip_low=self.cfg.clip_low, clip_high=self.cfg.clip_high,
                                             weight_cap=self.cfg.behaviour_weight_cap)
                if self.cfg.entropy_coef:
                    loss = loss - self.cfg.entropy_coef * entropy.mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                s["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm))
                self.optimizer.step()
                self.scheduler.step()
                s["entropy"] = entropy.mean().item()
                for k, v in s.items():
                    stats.setdefault(k, []).append(v)
        self.version += 1
        rho_mean = self._update_tracker(batch, tb)
        staleness = (batch.learner_version - tb.act_versions).numpy()
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out.update(
            version=self.version, episodes=tb.num_episodes, action_tokens=int(tb.act_tokens.numel()),
            tokens=int(tb.attention_mask.sum()), return_mean=float(returns.mean()),
            baseline_mean=float(baselines.mean()), spo_rho_mean=rho_mean,
            staleness_max=int(staleness.max()), staleness_mean=float(staleness.mean()),
            staleness_hist={int(k): int(v) for k, v in zip(*np.unique(staleness, return_counts=True))},
            dropped_stale=batch.dropped_stale, step_s=time.monotonic() - started,
        )
        return out

    def _update_tracker(self, batch: Batch, tb: TensorBatch) -> float:
        """SPO++: evidence is folded in the order of the policy version that produced it, not arrival."""
        with torch.no_grad():
            new_logp, _ = action_logprobs(self.model, tb)
        drift = (new_logp - tb.behav_logp).abs()
        n = tb.num_episodes
        divergence = torch.zeros(n).index_add_(0, tb.act_episode, drift) / torch.from_numpy(
            np.maximum(tb.tokens_per_episode, 1)).float()
        min_version = torch.full((n,), 1 << 30, dtype=torch.long).scatter_reduce(
            0, tb.act_episode, tb.act_versions, reduce="amin")
        order = sorted(range(n), key=lambda i: (int(min_version[i]), i))
        rhos = [self.tracker.update(batch.prompt_keys[i], batch.returns[i], float(divergence[i])) for i in order]
        return float(np.mean(rhos)) if rhos else 1.0
