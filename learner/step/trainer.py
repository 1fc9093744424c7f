"""One learner step: batch -> tensors -> (values, pi_prox) -> advantages -> updates -> version, estimator fold, stats.

Episodes served to the critic alone (Batch.critic_only) cannot move the policy. They never share a micro-batch
with the policy's episodes; the step's last update trains them after the policy's pass has been clipped, in a
pass of their own whose gradient reaches only the critic's parameters (the shared backbone runs without
gradients) and is clipped on its own to learner.max_grad_norm before it joins the critic's. Every policy
parameter, and its optimizer state, ends the step as with the batch without them; what the critic learned from
them reaches the policy from the next step on, as any critic's learning does (learner/step/update_rows.py).

Data parallel: every rank holds the same batch and computes the same advantages; micro-batches are dealt
round-robin over ranks, and gradients are summed across ranks. How (one process, DDP or FSDP2) is the parallel
strategy's business (learner/parallel/), chosen once when the Trainer is built, as is the estimator
(learner/estimators/registry.py): the step reads its properties and calls its hooks, never its name.

Device and precision (learner/device.py): the model, critic and optimizer state live on `learner.device`
in fp32; forwards run under autocast (bf16 on cuda by default). Batch bookkeeping (TensorBatch, indices,
advantages) stays on the CPU; each micro-batch's inputs and per-token loss terms are copied over.
"""
from __future__ import annotations

import math
import time

import torch

from turnstream.core.config import LearnerSection
from turnstream.learner.batch import forward
from turnstream.learner.batch.tensors import TensorBatch, logprobs_from_action_logits, to_tensors
from turnstream.learner.step.entropy_bonus import entropy_scale
from turnstream.learner.device import Placement, enable_checkpointing, keep_checkpointing_active, placement
from turnstream.learner.estimators.base import Advantages
from turnstream.learner.estimators.critic import PolicyAndValue
from turnstream.learner.estimators.episodes import token_agent_ids, turn_groups
from turnstream.learner.estimators.registry import estimator_for
from turnstream.learner.step.loss import explained_variance, step_kl
from turnstream.learner.step.objective import UpdateWeights, microbatch_loss, update_weights, value_term
from turnstream.learner.step.packing import NothingToTrain, drop_untrainable, microbatches, shard
from turnstream.learner.parallel.choose import strategy_for
from turnstream.learner.scale_defaults import parameter_count, resolve
from turnstream.learner.step.step_inputs import (StepInputs, fill_values, prox_from_training_forward, proximal_logp,
                                            values_from_training_forward)
from turnstream.learner.step.step_stats import MeanMax, batch_stats
from turnstream.learner.step.update_rows import UpdateRows, update_rows
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.protocol.messages import Batch

__all__ = ["NothingToTrain", "Trainer"]  # NothingToTrain: raised by step(), caught by learner/main.py

# step_kl is measured on a random quarter of the policy's episodes, at least STEP_KL_MIN_EPISODES (all of a smaller
# batch) and at most STEP_KL_MAX_EPISODES: its no-grad forward at the new weights costs about a third of a
# forward/backward per episode, which over a whole batch would add about a third to every step
STEP_KL_SHARE, STEP_KL_MIN_EPISODES, STEP_KL_MAX_EPISODES = 0.25, 4, 32


class Trainer:
    def __init__(self, model, cfg: LearnerSection, seed: int = 0, *, critic_path: str = "", ref_model=None,
                 where: Placement | None = None, longest_context: int = 0):
        """`longest_context`: the most tokens one context of an episode can hold (vllm.max_model_len), which an
        "auto" micro-batch budget is never below (scale_defaults.resolve)."""
        self.policy_parameters = parameter_count(model)  # before fsdp2 shards the model
        cfg = resolve(cfg, self.policy_parameters, longest_context)
        self.where = where or placement(cfg.device, cfg.precision)
        self.device = self.where.device
        self.parallel = strategy_for(cfg.parallel, self.where)
        self.rank, self.world = self.parallel.rank, self.parallel.world
        # fsdp2 shards the caller's `model` in place: no rank keeps the full weights. Pushes gather them bucket
        # by bucket (weight_buckets) and checkpoints write each rank's shards (learner/checkpoint/sharded.py).
        self.model = self.parallel.place(model)
        self.cfg = cfg
        self.vocab_size = model.config.vocab_size
        self.pad_id = model.config.pad_token_id or 0
        self.estimator = estimator_for(cfg)  # what it keeps across steps (SPO's tracker) goes into checkpoints
        self.net = self.parallel.place(PolicyAndValue(model, cfg.critic.mode if self.estimator.needs_critic else None,
                                                      critic_path))
        self.packed = forward.packs(model, cfg.pack_sequences, cfg.max_tokens_per_microbatch)
        if cfg.activation_checkpointing:
            enable_checkpointing(model, self.net.critic.backbone if self.net.critic is not None else None)
        # the network that takes gradients; forwards without gradients use self.net directly
        self.train_net = self.parallel.prepare(self.net, ref_model, cfg.reshard_after_forward)
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
        self.ref_model = ref_model  # frozen initial policy for the KL term (kl_coef > 0)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0

    # ---- the step -----------------------------------------------------------------------------------

    def step(self, batch: Batch) -> dict:
        started, cfg = time.monotonic(), self.cfg
        lr = self.optimizer.param_groups[0]["lr"]  # the policy's rate for this step's first update (warm-up)
        batch, dropped = drop_untrainable(batch, cfg.max_tokens_per_microbatch, self.vocab_size)
        tb = to_tensors(batch, self.vocab_size, self.pad_id)
        self._set_eval()
        x = self._inputs(batch, tb)  # pi_prox, values, pi_ref, advantages
        updates = MeanMax()
        for epoch in range(cfg.epochs):
            for rows in update_rows(tb, cfg.minibatches, self.generator, last_epoch=epoch == cfg.epochs - 1):
                updates.add(self._update(x, rows))
        self.version += 1
        if x.prox_from_forward:  # each rank kept its own micro-batches' share
            self._sum_over_ranks(x.prox_logp)
        out = updates.result()
        new_logp, out["step_kl"] = self._step_kl(x, every_episode=self.estimator.folds_updated_policy)
        folded = self.estimator.after_step(batch, tb, x.prox_logp, new_logp)
        self.parallel.end_step(self.net)
        step_s = time.monotonic() - started
        out.update(batch_stats(batch, tb, dropped), version=self.version, baseline_mean=x.advantages.baseline_mean,
                   **folded, step_s=step_s, learning_rate=lr,
                   tokens_per_s=float(tb.attention_mask.sum()) * cfg.epochs / max(step_s, 1e-9))
        if x.old_values is not None:
            out.update(self._critic_stats(x))
        return out

    def _inputs(self, batch: Batch, tb: TensorBatch) -> StepInputs:
        """Everything the updates read: pi_prox's log-probs, the critic's values and pi_ref's log-probs before
        the update (no-grad passes, unless the training forward gives them), then the advantages."""
        cfg, n = self.cfg, tb.act_tokens.numel()
        allowed = tb.allowed.to(self.device)
        estimator = self.estimator
        one_microbatch = len(self._groups(tb, torch.arange(tb.num_episodes))) == 1
        prox_from_forward = prox_from_training_forward(cfg, estimator, one_microbatch)
        values_from_forward = values_from_training_forward(cfg, estimator, one_microbatch)
        if prox_from_forward:
            prox_logp, old_values, cut_values = torch.zeros(n), None, None
        else:
            prox_logp, old_values, cut_values = self._no_grad_pass(
                tb, allowed, values=estimator.needs_critic and not values_from_forward)
        ref_logp = self._no_grad_pass(tb, allowed, reference=True)[0] if cfg.kl_coef > 0 else None
        agent_ids = token_agent_ids(batch, tb) if cfg.agent_norm else None
        if values_from_forward:  # filled micro-batch by micro-batch (fill_values)
            old_values, cut_values = torch.zeros(n), torch.full((tb.num_episodes,), float("nan"))
            advantages = Advantages(torch.zeros(n), estimator.value_positions(tb), torch.zeros(n))
        else:
            advantages = estimator.advantages(batch, tb, old_values, agent_ids, cut_values=cut_values)
        return StepInputs(batch, tb, allowed, advantages, prox_logp, prox_from_forward, old_values, cut_values,
                          values_from_forward, ref_logp,
                          ratio_group=turn_groups(tb) if estimator.needs_critic and cfg.critic.turn_ratio else None,
                          entropy_scale=entropy_scale(cfg, batch, tb, estimator, self.vocab_size),
                          agent_ids=agent_ids)

    def _update(self, x: StepInputs, rows: UpdateRows) -> dict[str, float]:
        """One optimizer step on the episodes `rows`, its gradient accumulated over this rank's micro-batches:
        the policy's episodes, clipped, then those served to the critic alone."""
        weights = update_weights(x, rows.all(), self.cfg.loss_agg)
        self.optimizer.zero_grad(set_to_none=True)
        stats = {"grad_norm": 0.0}
        if len(rows.policy):
            parts = MeanMax()
            # an idle rank (more ranks than micro-batches) still joins the gradient reduction, with zero loss
            mbs = self._my_microbatches(x.tb, rows.policy, at_least_one=True)
            for i, (mb, own) in enumerate(mbs):
                # gradients are reduced over ranks once per update, in the backward of the rank's last micro-batch
                with self.parallel.gradient_sync(self.train_net, last=i == len(mbs) - 1):
                    part = self._forward_backward(x, mb, weights, own=own)
                if own:
                    parts.add(part)
            stats = parts.result()
            stats["grad_norm"] = self.parallel.clip_grad_norm(self._params(), self.cfg.max_grad_norm)
        if len(rows.critic_only):
            stats.update(self._critic_only_pass(x, rows.critic_only, weights))
        self.optimizer.step()
        self.scheduler.step()
        return stats

    def _critic_only_pass(self, x: StepInputs, rows: torch.Tensor, weights: UpdateWeights) -> dict[str, float]:
        """The value loss of the episodes `rows`, served to the critic alone: its gradient, clipped on its own, is
        added to the critic's parameters' (already clipped) gradient."""
        params = self.net.critic_parameters()
        held = [p.grad for p in params]
        for p in params:
            p.grad = None
        parts = MeanMax()
        mbs = self._my_microbatches(x.tb, rows, at_least_one=True)
        for i, (mb, own) in enumerate(mbs):
            with self.parallel.critic_gradient_sync(self.train_net, params, last=i == len(mbs) - 1):
                with self.where.autocast():
                    _, values, cut_values = self.train_net(mb, values_only=True)
                if x.values_from_forward and own:
                    fill_values(self.estimator, x, mb, values, cut_values)
                loss, part = value_term(self.cfg, x, mb, values, weights)
                self.parallel.backward(loss, own)
            if own:
                parts.add(part)
        norm = self.parallel.clip_grad_norm(params, self.cfg.max_grad_norm)
        for p, g in zip(params, held):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        return {"critic_only_value_loss": parts.result().get("value_loss", 0.0), "critic_only_grad_norm": norm}

    def _forward_backward(self, x: StepInputs, mb: forward.MicroBatch, weights: UpdateWeights,
                          own: bool) -> dict[str, float]:
        """The micro-batch's loss and its backward; `own`: the micro-batch is this rank's share (not the
        stand-in of an idle rank), so what the training forward gives for the skipped passes is kept."""
        with self.where.autocast():
            logits, values, cut_values = self.train_net(mb)
        if x.values_from_forward and own:
            fill_values(self.estimator, x, mb, values, cut_values)
        logp, entropy = self._logprobs(logits, x.tb, mb, x.allowed)
        prox = proximal_logp(x, mb, logp, keep=own)
        loss, stats = microbatch_loss(self.cfg, x, mb, logp, entropy, prox, values, weights)
        self.parallel.backward(loss, own)
        return stats

    def _step_kl(self, x: StepInputs, every_episode: bool) -> tuple[torch.Tensor, float]:
        """The policy's new log-probs (of every episode's tokens, or of a random subset's) and step_kl, the KL
        from pi_prox to the new policy on those tokens.

        With one update per batch the ratio inside the loss is 1 by construction, so only this shows a step
        that was too large (e.g. a collapse onto one action). A subset of episodes estimates it: a forward
        over the whole batch would add a large share of a default step's time."""
        tb = x.tb
        rows = None
        if not every_episode:  # of the policy's episodes: those served to the critic alone were not sampled by pi_prox
            policy = tb.policy_rows()
            n = min(STEP_KL_MAX_EPISODES, max(STEP_KL_MIN_EPISODES, math.ceil(STEP_KL_SHARE * len(policy))))
            rows = policy[torch.randperm(len(policy), generator=self.generator)][:n]
        new_logp = self._no_grad_pass(tb, x.allowed, rows)[0]
        measured = slice(None) if rows is None else torch.isin(tb.act_episode, rows)
        return new_logp, step_kl(x.prox_logp[measured], new_logp[measured])

    def _critic_stats(self, x: StepInputs) -> dict[str, float]:
        m, targets = x.advantages.value_mask, x.advantages.value_targets
        out = {}
        if x.values_from_forward:  # each rank filled its micro-batches' share
            self._sum_over_ranks(x.old_values, targets)
            out["baseline_mean"] = float(x.old_values[m].mean()) if m.any() else 0.0
        out["explained_variance"] = explained_variance(x.old_values[m], targets[m])
        return out

    # ---- what inspection reads ----------------------------------------------------------------------

    def proximal_pass(self, tb: TensorBatch, *, values: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What a step on `tb` would read before its first update, from the weights as they are now: the policy's
        log-probs of every action token (pi_prox, no dropout) and, with `values`, the critic's values
        (`turnstream inspect`)."""
        self._set_eval()
        return self._no_grad_pass(tb, tb.allowed.to(self.device), values=values)[:2]

    # ---- helpers ------------------------------------------------------------------------------------

    @torch.no_grad()
    def _no_grad_pass(self, tb: TensorBatch, allowed: torch.Tensor, rows: torch.Tensor | None = None, *,
                      values: bool = False, reference: bool = False) -> tuple[torch.Tensor, ...]:
        """Log-probs of the action tokens of `rows` (default: every episode) under the policy, or the frozen
        reference model, and, if asked, the critic's values at the action tokens and at each truncated episode's
        cut ([E], NaN where it reads none); each rank fills its share, other tokens stay 0."""
        n = tb.act_tokens.numel()
        logp, vals, cuts = torch.zeros(n), torch.zeros(n), torch.zeros(tb.num_episodes)
        for mb, own in self._my_microbatches(tb, torch.arange(tb.num_episodes) if rows is None else rows):
            with self.where.autocast():
                logits, v, cut_v = ((forward.action_logits(self.ref_model, mb).logits, None, None) if reference
                                    else self.net(mb))
            if not own:
                continue
            logp[mb.select] = self._logprobs(logits, tb, mb, allowed)[0].cpu()
            if values:
                vals[mb.select] = v.float().cpu()
                cuts[mb.cut_rows] = cut_v.float().cpu()
        self._sum_over_ranks(logp, vals, cuts)
        if not values:
            return logp, None, None
        cuts[torch.from_numpy(tb.cut_pos < 0)] = float("nan")
        return logp, vals, cuts

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _my_microbatches(self, tb: TensorBatch, rows: torch.Tensor,
                         at_least_one: bool = False) -> list[tuple[forward.MicroBatch, bool]]:
        """This rank's micro-batches of `rows`, each with True, then stand-ins (False: outputs unused) where the
        parallel strategy runs more forwards than the rank has micro-batches. Episodes served to the critic alone
        are grouped apart from the others, so that every number the policy's episodes get is computed on the same
        micro-batches, bit for bit, as without them."""
        groups = self._groups(tb, rows)
        mine = [(forward.build(tb, g, self.packed, self.device), True) for g in shard(groups, self.rank, self.world)]
        turns = self.parallel.forwards(len(groups), len(mine))
        turns = max(turns, 1) if at_least_one else turns
        if turns > len(mine):
            mine += [(forward.build(tb, rows[:1], self.packed, self.device), False)] * (turns - len(mine))
        return mine

    def _groups(self, tb: TensorBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """The micro-batches of `rows` over every rank, the episodes served to the critic alone apart."""
        critic_only = torch.isin(rows, tb.critic_only_rows())
        return [g for part in (rows[~critic_only], rows[critic_only])
                for g in microbatches(tb.lengths, part, self.cfg.max_tokens_per_microbatch, self.packed)]

    def _set_eval(self) -> None:
        """No dropout: pi_prox and pi_theta must be the same function at equal weights."""
        self.net.train(False)
        keep_checkpointing_active(self.net)

    def _logprobs(self, act_logits: torch.Tensor, tb: TensorBatch, mb: forward.MicroBatch, allowed: torch.Tensor):
        temperature, mask_id, tokens = forward.sampling_params(tb, mb.select, self.device)
        return logprobs_from_action_logits(act_logits, temperature, mask_id, allowed, tokens,
                                           forward.truncation(tb, mb.select, self.device))

    def _sum_over_ranks(self, *tensors: torch.Tensor) -> None:
        self.parallel.sum_over_ranks(*tensors)

    # ---- what pushes read ---------------------------------------------------------------------------

    def weight_buckets(self, dtype: torch.dtype | None, bucket_bytes: int, announce=None) -> WeightBuckets:
        """The policy's weights for a push, cast to `dtype`, read bucket by bucket (learner/weights/source.py).
        Where reading them is a collective (fsdp2), every rank must read them: rank 0 passes `announce`, which
        tells the other ranks to join, and hands the source to the backend; the others `finish()` it."""
        return self.parallel.push_source(self.net.model, self.cfg.lora, dtype, bucket_bytes, announce)
