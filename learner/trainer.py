"""One learner step: recompute pi_prox (and critic values), advantages, decoupled PPO update, tracker update.

Data parallel: every rank holds the same batch and computes the same advantages; micro-batches are dealt
round-robin over ranks, and gradients are summed across ranks. Because the loss carries batch-global
aggregation weights (learner/loss.py), the sum over micro-batches and ranks is exactly the one-rank loss.
The sum is DistributedDataParallel's: it all-reduces gradient buckets while backward is still running
(communication overlaps compute), and each rank accumulates its micro-batches locally (`no_sync`) until
its last one, so there is one reduction per optimizer step.

Device and precision (learner/device.py): the model, critic and optimizer state live on `learner.device`
in fp32; forwards run under autocast (bf16 on cuda by default). Batch bookkeeping (TensorBatch, indices,
advantages) stays on the CPU; each micro-batch's inputs and per-token loss terms are copied over.
"""
from __future__ import annotations

import contextlib
import logging
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from turnstream.learner import estimators
from turnstream.learner import forward
from turnstream.learner.batching import TensorBatch, logprobs_from_action_logits, max_entropy, to_tensors
from turnstream.learner.checkpoint import rng_state, set_rng_state
from turnstream.learner.critic import PolicyAndValue
from turnstream.learner.device import Placement, enable_checkpointing, keep_checkpointing_active, placement
from turnstream.learner.loss import aggregation_weights, decoupled_ppo_loss, explained_variance, kl_k3, step_kl, value_loss
from turnstream.learner.packing import NothingToTrain, drop_out_of_vocabulary, drop_over_budget, microbatches, shard
from turnstream.learner.spo import SpoConfig, SpoTracker
from turnstream.protocol.messages import Batch
from turnstream.core.config import LearnerSection

__all__ = ["NothingToTrain", "Trainer"]  # NothingToTrain: raised by step(), caught by learner/main.py

log = logging.getLogger("turnstream.learner")

STEP_KL_EPISODES = 32  # episodes step_kl is measured on (all of a smaller batch)


class Trainer:
    def __init__(self, model, cfg: LearnerSection, seed: int = 0, *, critic_path: str = "", ref_model=None,
                 where: Placement | None = None):
        self.where = where or placement(cfg.device, cfg.precision)
        self.device = self.where.device
        self.model = model.to(self.device, dtype=torch.float32)  # fp32 master weights; autocast does the rest
        self.cfg = cfg
        self.vocab_size = model.config.vocab_size
        self.pad_id = model.config.pad_token_id or 0
        value_based = cfg.estimator in estimators.VALUE_BASED
        self.net = PolicyAndValue(model, cfg.critic.mode if value_based else None, critic_path)
        self.net.to(self.device, dtype=torch.float32)
        if ref_model is not None:
            ref_model.to(self.device)
        # Packing only under a budget: without one, the whole batch would become one row, and attention kernels
        # without cu_seqlens (sdpa, eager) pay for the full square of its length; the demo's step got 4x slower.
        # For the same reason "auto" packs only where attention skips the row's other episodes.
        auto = cfg.pack_sequences == "auto" and forward.packs_without_full_square(model)
        self.packed = (cfg.pack_sequences is True or auto) and cfg.max_tokens_per_microbatch > 0
        if self.packed:
            forward.check_packing_support(model)
        if cfg.activation_checkpointing:
            enable_checkpointing(model, self.net.critic.backbone if self.net.critic is not None else None)
        groups = [{"params": list(model.parameters()), "lr": cfg.lr}]
        if self.net.critic_parameters():
            groups.append({"params": self.net.critic_parameters(), "lr": cfg.critic.lr})
        # fused: one kernel for every parameter's update instead of several per tensor (cuda only)
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                           fused=self.device.type == "cuda")
        # Early Adam steps are close to sign descent (one-sample second moments); a warm-up keeps those
        # noisy steps small, which matters for RL where the first batches' gradients are mostly noise.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / max(1, cfg.warmup_steps)))
        self.tracker = SpoTracker(SpoConfig(cfg.spo.rho_min, cfg.spo.rho_max, cfg.spo.d_half))
        self.ref_model = ref_model  # frozen initial policy for the KL term (kl_coef > 0)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0
        distributed = dist.is_available() and dist.is_initialized()
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        # the network that takes gradients; forwards without gradients use self.net directly.
        # no buffer sync per forward: the model's buffers (rotary tables) are constants, equal on every rank.
        self.train_net = self.net if self.world == 1 else DistributedDataParallel(
            self.net, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            forward_sync_buffers=False)
        # With one optimizer step per batch, pi_prox is the policy of the training forward itself (same
        # weights, no dropout), so its log-probs are that forward's, detached: one forward pass saved.
        self.fuse_prox = True
        self._collected: torch.Tensor | None = None
        self._fill = None  # critic.whiten = "microbatch": fills a micro-batch's advantages from its forward
        self._allowed: torch.Tensor | None = None  # the batch's allowed-token sets, on the device
        self._max_entropy: torch.Tensor | None = None  # [N] log of each action token's choice count (CPU)

    # ---- helpers ------------------------------------------------------------------------------------

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _my_microbatches(self, tb: TensorBatch, rows: torch.Tensor) -> list[forward.MicroBatch]:
        groups = microbatches(tb.lengths, rows, self.cfg.max_tokens_per_microbatch, self.packed)
        return [forward.build(tb, g, self.packed, self.device)
                for g in shard(groups, self.rank, self.world)]

    def _set_eval(self) -> None:
        """No dropout: pi_prox and pi_theta must be the same function at equal weights."""
        self.net.train(False)
        keep_checkpointing_active(self.net)

    def _logprobs(self, act_logits: torch.Tensor, tb: TensorBatch, mb: forward.MicroBatch):
        temperature, mask_id, tokens = forward.sampling_params(tb, mb.select, self.device)
        return logprobs_from_action_logits(act_logits, temperature, mask_id, self._allowed, tokens)

    def _sum_over_ranks(self, *tensors: torch.Tensor) -> None:
        if self.world > 1:
            for t in tensors:  # CPU bookkeeping; nccl reduces device tensors only
                on_device = t.to(self.device)
                dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
                t.copy_(on_device.cpu())

    @torch.no_grad()
    def _evaluate(self, tb: TensorBatch, want_values: bool, want_ref: bool, rows: torch.Tensor | None = None):
        """Log-probs (and values, reference log-probs) of the action tokens of `rows` (default: every episode);
        each rank fills its share, other tokens stay 0."""
        n = tb.act_tokens.numel()
        logp, values, ref = torch.zeros(n), torch.zeros(n), torch.zeros(n)
        for mb in self._my_microbatches(tb, torch.arange(tb.num_episodes) if rows is None else rows):
            with self.where.autocast():
                logits, v = self.net(mb)
                ref_logits = forward.action_logits(self.ref_model, mb).logits if want_ref else None
            logp[mb.select] = self._logprobs(logits, tb, mb)[0].cpu()
            if want_values:
                values[mb.select] = v.float().cpu()
            if want_ref:
                ref[mb.select] = self._logprobs(ref_logits, tb, mb)[0].cpu()
        self._sum_over_ranks(logp, values, ref)
        return logp, (values if want_values else None), (ref if want_ref else None)

    @staticmethod
    def _agent_ids(batch: Batch, tb: TensorBatch) -> np.ndarray | None:
        """Per action token agent ids for Dr. MAS (None when the batch has a single agent)."""
        per_episode = estimators.episode_agent_ids(batch)
        return None if per_episode is None else per_episode[tb.act_episode.numpy()]

    # ---- the step -----------------------------------------------------------------------------------

    def step(self, batch: Batch) -> dict:
        started = time.monotonic()
        cfg = self.cfg
        batch, too_long = drop_over_budget(batch, cfg.max_tokens_per_microbatch)
        for err in too_long:
            log.warning("dropped from the batch: %s", err)
        batch, bad_tokens = drop_out_of_vocabulary(batch, self.vocab_size)
        for episode in bad_tokens:  # an actor's tokenizer that does not match the model, most likely
            log.error("dropped from the batch: episode %s holds token ids outside the model's vocabulary of %d",
                      episode, self.vocab_size)
        if (too_long or bad_tokens) and not batch.episode_ids:
            raise NothingToTrain(too_long, bad_tokens)
        tb = to_tensors(batch, self.vocab_size, self.pad_id)
        self._allowed = tb.allowed.to(self.device)
        self._max_entropy = max_entropy(tb, self.vocab_size) if cfg.entropy_coef else None
        self._set_eval()
        value_based = cfg.estimator in estimators.VALUE_BASED
        # critic.whiten resolved to micro-batches (only with one optimizer step per batch): the critic's values
        # come from the training forward itself, and each micro-batch's advantages are computed as it arrives
        values_in_step = value_based and cfg.values_in_step()
        fused = self.fuse_prox and cfg.epochs * cfg.minibatches == 1 and (not value_based or values_in_step)
        if fused and cfg.kl_coef == 0:
            prox_logp, old_values, ref_logp = None, None, None
        else:
            prox_logp, old_values, ref_logp = self._evaluate(tb, value_based and not values_in_step, cfg.kl_coef > 0)
            if fused:
                prox_logp = None
        agent_ids = self._agent_ids(batch, tb) if cfg.agent_norm else None
        self._fill = None
        if values_in_step:
            n = tb.act_tokens.numel()
            old_values = torch.zeros(n)
            adv = estimators.Advantages(torch.zeros(n), estimators.value_positions(cfg.estimator, tb), torch.zeros(n))
            self._fill = lambda mb, values: self._microbatch_advantages(batch, tb, mb, values, old_values, adv,
                                                                        agent_ids)
        else:
            adv = estimators.compute(cfg.estimator, batch, tb, tracker=self.tracker,
                                     spo_normalize=cfg.spo.normalize, gamma=cfg.critic.gamma, lam=cfg.critic.lam,
                                     old_values=old_values, agent_ids=agent_ids)
        ratio_group = estimators.turn_groups(tb) if value_based and cfg.critic.turn_ratio else None

        # pi_prox's log-probs of every action token: from the training forward itself when the step is fused
        self._collected = torch.zeros(tb.act_tokens.numel()) if prox_logp is None else None
        sums: dict[str, float] = {}
        maxes: dict[str, float] = {}
        for _ in range(cfg.epochs):
            for rows in torch.randperm(tb.num_episodes, generator=self.generator).chunk(cfg.minibatches):
                s = self._update(tb, rows, prox_logp, old_values, ref_logp, adv, ratio_group)
                for k, v in s.items():
                    if k.endswith("_max"):
                        maxes[k] = max(maxes.get(k, -np.inf), v)
                    else:
                        sums[k] = sums.get(k, 0.0) + v
        updates = cfg.epochs * min(cfg.minibatches, tb.num_episodes)
        out = {k: v / updates for k, v in sums.items()}
        out.update(maxes)
        self.version += 1
        if prox_logp is None:
            self._sum_over_ranks(self._collected)
            prox_logp = self._collected
        # How far this step moved the policy on the batch's action tokens, from a forward at the new weights.
        # With one update per batch the ratio inside the loss is 1 by construction, so only this shows a step
        # that was too large (e.g. a collapse onto one action). A random subset of episodes estimates it: a
        # forward over the whole batch cost about a third of the default step (bench learner).
        drift_updated = cfg.estimator == "spo" and cfg.spo.drift == "updated"  # needs every token's new log-prob
        rows = None if drift_updated else torch.randperm(tb.num_episodes, generator=self.generator)[:STEP_KL_EPISODES]
        new_logp, _, _ = self._evaluate(tb, False, False, rows)
        measured = slice(None) if rows is None else torch.isin(tb.act_episode, rows)
        out["step_kl"] = step_kl(prox_logp[measured], new_logp[measured])
        if cfg.estimator == "spo":  # SpoSection.drift: measured against pi_prox or the updated policy
            rho_mean = self._update_tracker(batch, tb, new_logp if drift_updated else prox_logp)
        else:
            rho_mean = 1.0
        returns = np.asarray(batch.returns, np.float64)
        staleness = (batch.learner_version - tb.act_versions).numpy()
        step_s = time.monotonic() - started
        out.update(
            version=self.version, episodes=tb.num_episodes, action_tokens=int(tb.act_tokens.numel()),
            tokens=int(tb.attention_mask.sum()), return_mean=float(returns.mean()),
            baseline_mean=adv.baseline_mean, spo_rho_mean=rho_mean,
            staleness_max=int(staleness.max()), staleness_mean=float(staleness.mean()),
            staleness_hist={int(k): int(v) for k, v in zip(*np.unique(staleness, return_counts=True))},
            dropped_stale=batch.dropped_stale, dropped_over_budget=len(too_long), dropped_bad_tokens=len(bad_tokens),
            step_s=step_s,
            tokens_per_s=float(tb.attention_mask.sum()) * cfg.epochs / max(step_s, 1e-9),
        )
        if too_long:  # which episodes were not trained (learner/main.py's audit trail, logs)
            out["dropped_over_budget_ids"] = [e.episode for e in too_long]
        if bad_tokens:
            out["dropped_bad_tokens_ids"] = bad_tokens
        if value_based:
            m = adv.value_mask
            if values_in_step:  # each rank filled its micro-batches' share
                self._sum_over_ranks(old_values, adv.value_targets)
                out["baseline_mean"] = float(old_values[m].mean()) if m.any() else 0.0
            out["explained_variance"] = explained_variance(old_values[m], adv.value_targets[m])
        return out

    def _microbatch_advantages(self, batch: Batch, tb: TensorBatch, mb: forward.MicroBatch, values: torch.Tensor,
                               old_values: torch.Tensor, adv: estimators.Advantages,
                               agent_ids: np.ndarray | None) -> None:
        """Fill the micro-batch's values, advantages and critic targets from its training forward's values:
        pre-update values, as the step's only optimizer step comes after every micro-batch."""
        cfg, sel = self.cfg, mb.select
        old_values[sel] = values.detach().float().cpu()
        part = estimators.compute(cfg.estimator, batch, tb, tracker=self.tracker, spo_normalize=cfg.spo.normalize,
                                  gamma=cfg.critic.gamma, lam=cfg.critic.lam, old_values=old_values,
                                  agent_ids=agent_ids, episodes=mb.rows.numpy())
        adv.token_adv[sel] = part.token_adv[sel]
        adv.value_targets[sel] = part.value_targets[sel]

    def _update(self, tb, rows, prox_logp, old_values, ref_logp, adv, ratio_group) -> dict[str, float]:
        """One optimizer step on the episodes `rows`, accumulated over this rank's micro-batches."""
        cfg = self.cfg
        in_minibatch = torch.isin(tb.act_episode, rows)
        local = torch.full((tb.num_episodes,), -1, dtype=torch.long)
        local[rows] = torch.arange(len(rows))
        weights = torch.zeros(tb.act_tokens.numel())
        weights[in_minibatch] = aggregation_weights(local[tb.act_episode[in_minibatch]], len(rows), cfg.loss_agg)
        value_weights = torch.zeros_like(weights)
        if adv.value_mask is not None:
            chosen = adv.value_mask & in_minibatch
            value_weights[chosen] = 1.0 / max(1, int(chosen.sum()))  # token-mean over trained positions
        # eval mode throughout (no dropout): the ratio pi_theta / pi_prox must be 1 at equal weights
        self.optimizer.zero_grad(set_to_none=True)
        stats: dict[str, float] = {}
        count = 0
        mbs = self._my_microbatches(tb, rows)
        idle = not mbs  # more ranks than micro-batches: this rank still joins the gradient reduction
        if idle:
            mbs = [forward.build(tb, rows[:1], self.packed, self.device)]
        for i, mb in enumerate(mbs):
            # gradients of all but the rank's last micro-batch accumulate locally (forward and backward
            # inside no_sync); the last one's backward reduces them over ranks
            last = i == len(mbs) - 1
            with contextlib.nullcontext() if last or self.world == 1 else self.train_net.no_sync():
                loss, s = self._microbatch_loss(tb, mb, prox_logp, old_values, ref_logp, adv, ratio_group,
                                                weights, value_weights, collect=not idle)
                # DDP averages over ranks; the weights already divide by the global count, so undo the average
                (loss * (0.0 if idle else self.world)).backward()
            if idle:
                break
            count += 1
            for k, v in s.items():
                stats[k] = max(stats.get(k, -np.inf), v) if k.endswith("_max") else stats.get(k, 0.0) + v
        stats = {k: (v if k.endswith("_max") else v / max(1, count)) for k, v in stats.items()}
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self._params(), cfg.max_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        return stats

    def _microbatch_loss(self, tb, mb, prox_logp, old_values, ref_logp, adv, ratio_group, weights, value_weights,
                         *, collect: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the batch loss (its tokens' aggregation weights already sum over the
        batch), and its statistics. `collect`: keep its pi_prox log-probs for SPO's drift."""
        cfg, dev, sel = self.cfg, self.device, mb.select
        with self.where.autocast():
            logits, values = self.train_net(mb)
        if self._fill is not None and collect:
            self._fill(mb, values)
        logp, entropy = self._logprobs(logits, tb, mb)
        prox = logp.detach() if prox_logp is None else prox_logp[sel].to(dev)
        if self._collected is not None and collect:
            self._collected[sel] = prox.cpu()
        w = weights[sel].to(dev)
        loss, s = decoupled_ppo_loss(
            logp, prox, tb.behav_logp[sel].to(dev), adv.token_adv[sel].to(dev), clip_low=cfg.clip_low,
            clip_high=cfg.clip_high, weight_cap=cfg.behaviour_weight_cap, mode=cfg.behaviour_weight_mode,
            mask_low=cfg.is_mask_low, mask_high=cfg.is_mask_high, seq_index=tb.act_episode[sel].to(dev),
            ratio_group=None if ratio_group is None else ratio_group[sel].to(dev), token_weights=w)
        s["entropy"] = float((w * entropy.detach()).sum() / w.sum().clamp(min=1e-12))
        if cfg.entropy_coef:
            # in units of the largest entropy the token could have (log of its allowed set's size, or of the
            # vocabulary), so one coefficient means the same for two actions as for a free-text vocabulary
            loss = loss - cfg.entropy_coef * (w * entropy / self._max_entropy[sel].to(dev)).sum()
        if ref_logp is not None:
            kl = kl_k3(logp, ref_logp[sel].to(dev))
            s["ref_kl"] = float((w * kl.detach()).sum() / w.sum().clamp(min=1e-12))
            loss = loss + cfg.kl_coef * (w * kl).sum()
        if values is not None:
            vl, vs = value_loss(values.float(), old_values[sel].to(dev), adv.value_targets[sel].to(dev),
                                cfg.critic.value_clip, value_weights[sel].to(dev))
            s.update(vs, value_loss=vl.item())
            loss = loss + cfg.critic.value_coef * vl
        return loss, s

    def _update_tracker(self, batch: Batch, tb: TensorBatch, logp: torch.Tensor) -> float:
        """SPO++: evidence is folded in the order of the policy version that produced it, not arrival.

        D = mean |log mu - log pi| over the episode's action tokens, with pi's log-probs `logp`.
        """
        drift = (logp - tb.behav_logp).abs()
        n = tb.num_episodes
        divergence = torch.zeros(n).index_add_(0, tb.act_episode, drift) / torch.from_numpy(
            np.maximum(tb.tokens_per_episode, 1)).float()
        min_version = torch.full((n,), 1 << 30, dtype=torch.long).scatter_reduce(
            0, tb.act_episode, tb.act_versions, reduce="amin")
        order = sorted(range(n), key=lambda i: (int(min_version[i]), i))
        rhos = [self.tracker.update(batch.prompt_keys[i], batch.returns[i], float(divergence[i])) for i in order]
        return float(np.mean(rhos)) if rhos else 1.0

    # ---- checkpoint state ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"version": self.version, "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "critic": self.net.critic_state_dict(),
                "rng": rng_state(self.generator)}

    def load_state_dict(self, state: dict, tracker_state: dict) -> None:
        self.version = int(state["version"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.net.load_critic_state_dict(state["critic"])
        set_rng_state(state["rng"], self.generator)
        self.tracker.load_state_dict(tracker_state)
