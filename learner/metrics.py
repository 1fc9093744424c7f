"""Prometheus metrics of the learner process."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from turnstream.core.build_info import register_build_info


class LearnerMetrics:
    # step_kl: how far the last step moved the policy (KL before -> after on its batch's action tokens);
    # approx_kl and clip_fraction compare pi_theta with pi_prox inside the loss and stay 0 with one update per
    # batch (epochs = minibatches = 1), where the ratio is 1 by construction
    GAUGES = ("policy_loss", "step_kl", "approx_kl", "clip_fraction", "entropy", "is_weight_mean", "is_weight_max",
              "is_weight_truncated_fraction", "is_weight_masked_fraction", "return_mean", "grad_norm",
              "value_loss", "value_clip_fraction", "explained_variance", "ref_kl", "tokens_per_s", "learning_rate")

    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        register_build_info(r, "learner")
        self.steps = Counter("turnstream_learner_steps_total", "Optimizer steps taken", registry=r)
        self.version = Gauge("turnstream_learner_policy_version", "Current policy version", registry=r)
        self.episodes = Counter("turnstream_learner_trained_episodes_total", "Episodes trained on", registry=r)
        self.step_seconds = Histogram("turnstream_learner_step_seconds", "Time of one training step", registry=r)
        self.wait_seconds = Histogram("turnstream_learner_batch_wait_seconds", "Time waiting for a batch",
                                      registry=r)
        self.push_seconds = Histogram("turnstream_learner_weight_push_seconds",
                                      "Pause-to-resume time of a weight push over all servers", registry=r)
        self.push_failures = Counter("turnstream_learner_weight_push_failures_total", "Failed weight pushes",
                                     registry=r)
        # pushes checked against the learner's log-probs of a probe (learner/sync/verify.py); servers are bounded
        # by vllm.urls, so the server label is
        self.verify_failures = Counter("turnstream_learner_weight_verify_failures_total",
                                       "Pushes a server took but does not serve (probe log-probs off the learner's, "
                                       "or the probe unanswered), by server", ["server"], registry=r)
        self.verified_version = Gauge("turnstream_learner_weight_verified_version",
                                      "Last policy version a server was verified to serve", ["server"], registry=r)
        self.auth_failures = Counter("turnstream_learner_auth_failures_total",
                                     "Subscribers refused by CURVE on the version PUB socket: reason auth = key not "
                                     "on the allow-list, protocol or no_detail = bad handshake (e.g. plaintext)",
                                     ["socket", "reason"], registry=r)
        # staleness is bounded by buffer.max_staleness, so it is a bounded label
        self.rejected_batches = Counter("turnstream_learner_rejected_batches_total",
                                        "Batches skipped because the model cannot take them", registry=r)
        # one episode longer than learner.max_tokens_per_microbatch: dropped before the step (learner/step/packing.py)
        self.over_budget = Counter("turnstream_learner_over_budget_episodes_total",
                                   "Episodes dropped because alone they exceed max_tokens_per_microbatch",
                                   registry=r)
        self.bad_tokens = Counter("turnstream_learner_bad_token_episodes_total",
                                  "Episodes dropped because they hold token ids outside the model's vocabulary",
                                  registry=r)
        self.staleness = Counter("turnstream_learner_trained_tokens_total",
                                 "Action tokens trained on, by staleness in policy versions", ["staleness"],
                                 registry=r)
        # Prometheus naming: a rate is "_per_second"; the JSONL key stays tokens_per_s
        self.stat = {name: Gauge(f"turnstream_learner_{name.replace('_per_s', '_per_second')}",
                                 f"Last step's {name.replace('_', ' ')}", registry=r)
                     for name in self.GAUGES}

    def record(self, stats: dict) -> None:
        self.steps.inc()
        self.version.set(stats["version"])
        self.episodes.inc(stats["episodes"])
        self.step_seconds.observe(stats["step_s"])
        self.over_budget.inc(stats.get("dropped_over_budget", 0))
        self.bad_tokens.inc(stats.get("dropped_bad_tokens", 0))
        for staleness, count in stats["staleness_hist"].items():
            self.staleness.labels(str(staleness)).inc(count)
        for name in self.GAUGES:
            if name in stats:
                self.stat[name].set(stats[name])
