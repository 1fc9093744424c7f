"""The run configuration: one TOML file, one table per role. Every field is documented here.

Ports set to 0 are chosen by the launcher (`turnstream up` / `demo`), which writes the resolved file
into the run directory and hands that file to every role.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from turnstream.core.configtools import ConfigError, check, dump_toml, from_dict, load_toml, to_dict


def check_cpus(cpus: list[int], path: str) -> None:
    # the machine's CPUs, not this process's affinity: a pinned role reads the other roles' pins too
    import os

    n = os.cpu_count() or 1
    check(all(0 <= c < n for c in cpus), path, f"CPU ids must be in 0..{n - 1} on this machine, got {cpus}")


@dataclass
class RunSection:
    name: str = "run"
    run_dir: str = "runs/run"  # relative paths are relative to the working directory
    seed: int = 0
    time_limit_s: float = 600.0  # the launcher stops everything after this long
    target_success: float = 0.9  # `demo` stops once the rolling success reaches this
    rolling_episodes: int = 256  # window of the rolling success rate

    def validate(self, path: str) -> None:
        check(self.time_limit_s > 0, f"{path}.time_limit_s", "must be > 0")
        check(0.0 < self.target_success <= 1.0, f"{path}.target_success", "must be in (0, 1]")
        check(self.rolling_episodes > 0, f"{path}.rolling_episodes", "must be > 0")


@dataclass
class ModelSection:
    path: str = "runs/tiny-model"  # Hugging Face checkpoint directory
    build_tiny_if_missing: bool = True  # `demo`/`up` build the tiny model here if the directory is empty
    tiny_seed: int = 0
    frozen_path: str = ""  # checkpoint of the fixed opponent (actor.frozen_agents); empty: path


@dataclass
class VllmSection:
    urls: list[str] = field(default_factory=list)  # external servers; empty: the launcher starts them
    # servers of the fixed policy that actor.frozen_agents play (never sent weights); empty: the launcher
    # starts one from model.frozen_path (default: model.path, i.e. the policy as training starts)
    frozen_urls: list[str] = field(default_factory=list)
    num_servers: int = 1
    base_port: int = 0
    max_num_seqs: int = 256
    max_model_len: int = 512
    kv_cache_gib: int = 1
    omp_threads: int = 1
    dtype: str = "float32"
    startup_timeout_s: float = 180.0
    extra_args: list[str] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)  # CPU ids this role is pinned to (os affinity); empty: any
    # the actors' inference fleet (actors/fleet.py)
    urls_file: str = ""  # optional file of server URLs, one a line, re-read while running (add/remove servers)
    retries: int = 2  # a failed generate is retried on up to this many other servers
    health_interval_s: float = 2.0  # /health + /weight_info poll of every server
    wait_for_server_s: float = 10.0  # how long a request waits for a usable server before it fails
    # how the learner pushes weights (learner/weight_sync.py)
    weight_sync: Literal["disk", "nccl"] = "disk"
    nccl_master_address: str = ""  # nccl: the learner's address as the servers reach it
    nccl_master_port: int = 0  # nccl: the port of the learner's rendezvous (rank 0)

    def validate(self, path: str) -> None:
        check(self.num_servers >= 1 or bool(self.urls), f"{path}.num_servers", "must be >= 1")
        check_cpus(self.cpus, f"{path}.cpus")
        check(self.max_num_seqs >= 1, f"{path}.max_num_seqs", "must be >= 1")
        check(self.kv_cache_gib >= 1, f"{path}.kv_cache_gib", "must be >= 1")
        for url in self.urls:
            check(url.startswith(("http://", "https://")), f"{path}.urls",
                  f"{url!r} must start with http:// or https://")
        check(self.retries >= 0, f"{path}.retries", "must be >= 0")
        check(self.health_interval_s > 0, f"{path}.health_interval_s", "must be > 0")
        check(self.wait_for_server_s >= 0, f"{path}.wait_for_server_s", "must be >= 0")
        check(self.weight_sync in ("disk", "nccl"), f"{path}.weight_sync", "must be disk or nccl")
        if self.weight_sync == "nccl":
            check(bool(self.nccl_master_address), f"{path}.nccl_master_address",
                  "the nccl weight sync needs the learner's address as the servers reach it")
            check(0 < self.nccl_master_port < 65536, f"{path}.nccl_master_port", "must be a TCP port in 1..65535")


@dataclass
class EnvSection:
    name: str = "follow_signs"
    args: dict = field(default_factory=dict)  # passed to the environment's constructor

    def validate(self, path: str) -> None:
        from turnstream.actors.registry import known_envs, make_env

        check(self.name in known_envs(), f"{path}.name",
              f"unknown environment {self.name!r}; known: {', '.join(known_envs())}")
        try:
            make_env(self.name, **self.args)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}.args: {exc}") from None


@dataclass
class NetworkSection:
    host: str = "127.0.0.1"  # where roles bind and connect
    buffer_ingest_port: int = 0  # actors -> buffer (ROUTER)
    buffer_serve_port: int = 0  # learner -> buffer (ROUTER)
    learner_pub_port: int = 0  # learner -> everyone: version announcements (PUB)
    max_message_bytes: int = 64 * 1024 * 1024
    # CURVE authentication and encryption of every ZeroMQ socket (protocol/auth.py); "auto": on whenever
    # host is not a loopback address, so traffic that leaves the machine is never plaintext
    curve: Literal["off", "on", "auto"] = "auto"
    keys_dir: str = ""  # from `turnstream keygen DIR`: server.key(_secret), client.key_secret, allowed_clients/
    # Roles on different hosts bind on one address and reach each other by name; each of these is `host`
    # when empty, so a single-host run sets only `host`.
    bind_host: str = ""  # where this process binds its sockets and /metrics, e.g. 0.0.0.0
    buffer_host: str = ""  # where actors and the learner reach the buffer
    learner_host: str = ""  # where the buffer reaches the learner's PUB socket

    @property
    def listen_host(self) -> str:
        return self.bind_host or self.host

    @property
    def buffer_address(self) -> str:
        return self.buffer_host or self.host

    @property
    def learner_address(self) -> str:
        return self.learner_host or self.host

    def validate(self, path: str) -> None:
        for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
            port = getattr(self, name)
            check(0 <= port < 65536, f"{path}.{name}", f"must be a TCP port in 0..65535, got {port}")
        check(self.curve in ("off", "on", "auto"), f"{path}.curve", "must be off, on or auto")
        if self.curve_enabled:
            from turnstream.protocol.auth import keys_problem

            problem = keys_problem(self.keys_dir)
            check(not problem, f"{path}.keys_dir", problem)

    @property
    def curve_enabled(self) -> bool:
        from turnstream.protocol.auth import curve_enabled

        # "auto" encrypts when any address a socket binds or connects to can leave the machine
        return any(curve_enabled(self.curve, h) for h in (self.listen_host, self.buffer_address, self.learner_address))


@dataclass
class ActorSection:
    num_processes: int = 1
    concurrent_episodes: int = 64  # K episodes in flight per actor process
    temperature: float = 1.0
    max_new_tokens: int = 16
    max_unacked: int = 1024  # bounded window of chunks awaiting an ack
    resend_after_s: float = 5.0
    request_timeout_s: float = 60.0
    metrics_port: int = 0  # first actor's port; actor i uses metrics_port + i
    max_turns: int = 0  # turns per episode before it is truncated; 0: only the context length limits it
    # agents that do not share the trained policy: a fixed opponent sampled from vllm.frozen_urls, whose
    # turns are part of the others' observations but are never streamed for training
    frozen_agents: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)  # CPU ids this role is pinned to (os affinity); empty: any

    def validate(self, path: str) -> None:
        check(self.num_processes >= 1, f"{path}.num_processes", "must be >= 1")
        check(all(a >= 0 for a in self.frozen_agents), f"{path}.frozen_agents", "agent ids must be >= 0")
        check_cpus(self.cpus, f"{path}.cpus")
        check(self.max_turns >= 0, f"{path}.max_turns", "must be >= 0")
        check(self.concurrent_episodes >= 1, f"{path}.concurrent_episodes", "must be >= 1")
        check(self.temperature > 0, f"{path}.temperature", "must be > 0 (greedy sampling has no log-probs to correct)")
        check(self.max_unacked >= 1, f"{path}.max_unacked", "must be >= 1")


@dataclass
class BufferSection:
    batch_episodes: int = 128  # B: episodes per learner batch
    eta: int = 2  # AReaL off-policyness for admission; 0 = synchronous
    max_staleness: int = 4  # hard bound: tokens older than this many versions never reach the learner
    max_running: int = 512  # episodes in flight across all actors
    max_items: int = 8192  # episodes held (running + ready); admission stops at this bound
    episode_timeout_s: float = 60.0  # an episode without a chunk for this long is abandoned
    actor_timeout_s: float = 15.0  # an actor silent this long loses its unused credits
    metrics_port: int = 0
    # which complete episodes make a batch: fifo (completion order), freshest (newest behaviour version
    # first) or group (all group_size episodes of one prompt_key together, for group baselines)
    sampling: Literal["fifo", "freshest", "group"] = "fifo"
    group_size: int = 1
    group_timeout_s: float = 120.0  # a group still short of group_size this long after a member completed is dropped
    # Reverb-style rate limiter (samples per inserted episode); the slower side waits, nothing is dropped.
    samples_per_insert: float = 1.0
    min_size_to_sample: int = 1  # complete episodes held before the first batch is served
    error_buffer: float = 0.0  # half-width of the allowed samples-vs-inserts window; 0: no window
    # write-ahead log of acked chunks (protocol/SCHEMA.md, "Durability")
    wal: bool = True
    wal_dir: str = ""  # empty: <run_dir>/buffer-wal
    wal_fsync: Literal["always", "interval", "never"] = "always"  # when an acked chunk reaches the disk
    wal_fsync_interval_s: float = 0.05  # for wal_fsync = "interval"
    wal_compact_bytes: int = 256 * 1024 * 1024  # rewrite the log without consumed data past this size
    # heap faulted in at start and kept mapped for received frames (buffer/warm_heap.py): kept chunks take no
    # page faults until the buffer has grown this much past its start (turnstream_buffer_page_faults_total
    # rising while chunks come in: raise it); 0: glibc's defaults
    ingest_reserve_bytes: int = 64 * 1024 * 1024
    # an ack (and the log commit before it) waits up to this long for more chunks, so that one ack message
    # and one fsync answer several; 16 waiting chunks are acked at once. 0: every drained group is acked
    ack_delay_ms: float = 1.0
    cpus: list[int] = field(default_factory=list)  # CPU ids this role is pinned to (os affinity); empty: any

    def validate(self, path: str) -> None:
        from turnstream.buffer.ratelimit import limiter_problem
        from turnstream.buffer.warm_heap import MAX_RESERVE_BYTES

        check(self.batch_episodes >= 1, f"{path}.batch_episodes", "must be >= 1")
        check(self.eta >= 0, f"{path}.eta", "must be >= 0")
        check(self.max_staleness >= self.eta, f"{path}.max_staleness",
              f"must be >= eta ({self.eta}), or admitted episodes would be dropped as stale")
        check(self.max_items >= self.batch_episodes, f"{path}.max_items", "must be >= batch_episodes")
        check(self.episode_timeout_s > 0, f"{path}.episode_timeout_s", "must be > 0")
        check(self.actor_timeout_s > 0, f"{path}.actor_timeout_s", "must be > 0")
        check(self.group_size >= 1, f"{path}.group_size", "must be >= 1")
        check(self.group_timeout_s > 0, f"{path}.group_timeout_s", "must be > 0")
        check_cpus(self.cpus, f"{path}.cpus")
        check(self.sampling != "group" or self.group_size <= self.batch_episodes, f"{path}.group_size",
              f"must be <= batch_episodes ({self.batch_episodes}), or no group fits in a batch (deadlock)")
        field_name, reason = limiter_problem(
            self.samples_per_insert, self.min_size_to_sample, self.error_buffer or float("inf"),
            batch_episodes=self.batch_episodes, max_items=self.max_items, eta=self.eta)
        check(not field_name, f"{path}.{field_name}", reason)
        check(self.wal_fsync_interval_s > 0, f"{path}.wal_fsync_interval_s", "must be > 0")
        check(0 <= self.ack_delay_ms <= 1000, f"{path}.ack_delay_ms", "must be in 0..1000")
        check(0 <= self.ingest_reserve_bytes <= MAX_RESERVE_BYTES, f"{path}.ingest_reserve_bytes",
              f"must be in 0..{MAX_RESERVE_BYTES} (glibc's trim threshold is a C int; 0 turns it off)")
        check(self.wal_compact_bytes >= 1024 * 1024, f"{path}.wal_compact_bytes", "must be >= 1048576 (1 MiB)")


@dataclass
class SpoSection:
    rho_min: float = 0.875
    rho_max: float = 0.96
    d_half: float = 0.06
    normalize: Literal["token", "sequence"] = "token"  # SPO++ action-token measure, or SPO's per-episode
    sampling_epsilon: float = 0.05  # floor of the uncertainty weight sqrt(v(1-v)) + eps for prompt sampling
    # policy the drift D = mean|log mu - log pi| is measured against. proximal: the policy being trained when
    # the evidence is folded in, as an asynchronous learner should (mu sampled it, possibly versions ago).
    # updated: after this step's update, the synchronous SPO code's order. Both are read from passes every step
    # makes anyway (the training forward, and the one after the update that measures step_kl)
    drift: Literal["proximal", "updated"] = "proximal"

    def validate(self, path: str) -> None:
        check(0 < self.rho_min <= self.rho_max <= 1, f"{path}.rho_min", "need 0 < rho_min <= rho_max <= 1")
        check(self.d_half > 0, f"{path}.d_half", "must be > 0")
        check(self.sampling_epsilon >= 0, f"{path}.sampling_epsilon", "must be >= 0")


@dataclass
class CriticSection:
    """Value function for turn_gae / token_gae (unused by spo, grpo, rloo)."""

    mode: Literal["shared", "separate"] = "shared"  # value head on the policy backbone, or its own model
    path: str = ""  # separate critic's backbone checkpoint; empty: model.path
    lr: float = 1e-3  # the critic needs a higher learning rate than the actor (Turn-PPO ablations)
    value_coef: float = 0.5  # weight of the value loss next to the policy loss (shared mode)
    value_clip: float = 0.2  # c_v of the pessimistic value clip; 0 disables clipping
    gamma: float = 0.99
    lam: float = 0.9
    turn_ratio: bool = False  # turn-level geometric-mean importance ratio (MPO / ST-PPO style)
    # which tokens advantages are whitened over. batch: the whole batch, which needs every value before the
    # first loss, so one more no-grad forward per step. microbatch: each forward/backward micro-batch's own
    # tokens (as CleanRL normalises per minibatch); the values then come from the training forward, no extra
    # pass (bench learner: 0.92 of a bare loop against 0.70). auto: microbatch where it equals batch (the
    # batch is one micro-batch: max_tokens_per_microbatch = 0, one optimizer step per batch), else batch
    whiten: Literal["auto", "batch", "microbatch"] = "auto"

    def validate(self, path: str) -> None:
        check(self.lr > 0, f"{path}.lr", "must be > 0")
        check(self.value_coef >= 0, f"{path}.value_coef", "must be >= 0")
        check(self.value_clip >= 0, f"{path}.value_clip", "must be >= 0")
        check(0 <= self.gamma <= 1, f"{path}.gamma", "must be in [0, 1]")
        check(0 <= self.lam <= 1, f"{path}.lam", "must be in [0, 1]")


@dataclass
class LearnerSection:
    estimator: Literal["spo", "turn_gae", "token_gae", "grpo", "rloo"] = "spo"
    lr: float = 3e-4
    warmup_steps: int = 0  # optimizer steps of linear learning-rate warm-up
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    behaviour_weight_cap: float = 2.0  # truncated IS on pi_prox / mu
    # what to do with the behaviour weight w = pi_prox / mu: truncate at the cap (TIS), mask tokens or whole
    # sequences (geometric mean) outside [is_mask_low, is_mask_high] (IcePop / AReaL), or ignore it (none)
    behaviour_weight_mode: Literal["truncate", "mask_token", "mask_sequence", "none"] = "truncate"
    is_mask_low: float = 0.5
    is_mask_high: float = 5.0
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    # bonus on the sampling distribution's entropy (over the allowed-token set, else the vocabulary), counted in
    # units of its maximum (log of the number of choices). Keeps multi-turn tasks out of observation-blind
    # attractors: on goal_walk, 0 collapsed onto "always one side" in 2 of 3 seeds, 0.03 and 0.1 behaved like 0,
    # and 0.2 (0.29 per nat for two actions) learned in every seed (BENCHMARKS.md, "The learner learns")
    entropy_coef: float = 0.2
    kl_coef: float = 0.0  # k3 KL to the frozen initial model in the loss; 0: no reference model is loaded
    agent_norm: bool = False  # Dr. MAS: normalise advantages per agent id (when batches carry agent ids)
    minibatches: int = 1
    epochs: int = 1
    # token budget of one forward/backward (learner/packing.py): packed tokens, or rows x longest episode when
    # pack_sequences is off; it bounds activation memory. An episode longer than the budget alone is dropped
    # (counted, logged). 0: no budget, the whole minibatch in one micro-batch
    max_tokens_per_microbatch: int = 0
    # episodes back to back in rows of max_tokens_per_microbatch, no padding (position ids delimit them); only
    # with a budget. auto: pack where attention skips the other episodes of a row (flash_attention_2 with
    # cu_seqlens, flex_attention); sdpa and eager compute the row's full square, which costs more than padding
    # when episodes are short (bench learner --pack-sequences true/false: 1.6x on the tiny model)
    pack_sequences: Literal["auto", True, False] = "auto"
    # where and how the learner computes (learner/device.py): auto = cuda when present, else cpu;
    # precision auto = bf16 autocast on cuda (fp32 master weights and AdamW state), fp32 on cpu
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    activation_checkpointing: bool = False  # recompute each decoder layer in backward: less memory, ~1/3 more compute
    attn_implementation: str = "auto"  # auto: flash_attention_2 on cuda if installed, else sdpa; or any HF name
    max_steps: int = 0  # 0: run until stopped
    # token budget of one batch (observation + generated tokens): the buffer fills a batch up to it, with at
    # most buffer.batch_episodes episodes; 0: exactly buffer.batch_episodes episodes
    batch_max_tokens: int = 0
    cpus: list[int] = field(default_factory=list)  # CPU ids this role is pinned to (os affinity); empty: any
    torch_threads: int = 1
    weights_dir: str = ""  # where pushed weights are written; empty: <run_dir>/weights
    keep_weight_versions: int = 2
    # push version v into the servers while step v+1 trains (learner/main.py): the push's time leaves the
    # learner's critical path, and data may be one version staler. auto: with the disk backend (pushes read a
    # saved snapshot) when buffer.eta >= 1; the synchronous baseline (eta 0) never overlaps
    overlap_push: Literal["auto", True, False] = "auto"
    checkpoint_every: int = 0  # steps between checkpoints under <run_dir>/checkpoints; 0: never
    keep_checkpoints: int = 2
    resume: bool = True  # on start, continue from the latest checkpoint in <run_dir>/checkpoints
    metrics_port: int = 0
    spo: SpoSection = field(default_factory=SpoSection)
    critic: CriticSection = field(default_factory=CriticSection)

    def values_in_step(self) -> bool:
        """Whether a value-based step reads the critic in its training forward (critic.whiten resolved)."""
        one_update = self.epochs * self.minibatches == 1
        if self.critic.whiten == "auto":
            return one_update and self.max_tokens_per_microbatch == 0
        return self.critic.whiten == "microbatch"

    def validate(self, path: str) -> None:
        check(self.lr > 0, f"{path}.lr", "must be > 0")
        check(0 < self.clip_low < 1, f"{path}.clip_low", "must be in (0, 1)")
        check(self.clip_high > 0, f"{path}.clip_high", "must be > 0")
        check(self.behaviour_weight_cap >= 1, f"{path}.behaviour_weight_cap", "must be >= 1")
        check(0 <= self.is_mask_low <= 1, f"{path}.is_mask_low", "must be in [0, 1]")
        check(self.is_mask_high >= 1, f"{path}.is_mask_high", "must be >= 1")
        check(self.entropy_coef >= 0, f"{path}.entropy_coef", "must be >= 0")
        check(self.kl_coef >= 0, f"{path}.kl_coef", "must be >= 0")
        check(self.minibatches >= 1 and self.epochs >= 1, f"{path}.minibatches", "minibatches and epochs must be >= 1")
        check(self.max_tokens_per_microbatch >= 0, f"{path}.max_tokens_per_microbatch", "must be >= 0")
        check(self.batch_max_tokens >= 0, f"{path}.batch_max_tokens", "must be >= 0")
        check_cpus(self.cpus, f"{path}.cpus")
        check(self.device == "auto" or self.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", self.device) is not None,
              f"{path}.device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        check(self.precision in ("auto", "fp32", "bf16"), f"{path}.precision", "must be auto, fp32 or bf16")
        check(self.keep_weight_versions >= 1, f"{path}.keep_weight_versions", "must be >= 1")
        check(self.checkpoint_every >= 0, f"{path}.checkpoint_every", "must be >= 0")
        check(self.keep_checkpoints >= 1, f"{path}.keep_checkpoints", "must be >= 1")
        check(self.critic.whiten != "microbatch" or self.epochs * self.minibatches == 1, f"{path}.critic.whiten",
              "microbatch reads the critic in the training forward, which needs one optimizer step per batch "
              "(epochs = minibatches = 1)")


@dataclass
class Config:
    run: RunSection = field(default_factory=RunSection)
    model: ModelSection = field(default_factory=ModelSection)
    vllm: VllmSection = field(default_factory=VllmSection)
    env: EnvSection = field(default_factory=EnvSection)
    network: NetworkSection = field(default_factory=NetworkSection)
    actor: ActorSection = field(default_factory=ActorSection)
    buffer: BufferSection = field(default_factory=BufferSection)
    learner: LearnerSection = field(default_factory=LearnerSection)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.run_dir)

    def dumps(self) -> str:
        return dump_toml(to_dict(self))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    data = load_toml(path) if path else {}
    for item in overrides or []:
        _apply_override(data, item)
    return from_dict(Config, data)


def _apply_override(data: dict, item: str) -> None:
    """`section.key=value`, value parsed as TOML (so strings need quotes unless they are bare words)."""
    import tomllib

    if "=" not in item:
        raise ConfigError(f"--set {item}: expected section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as spo or a path
    parts = key.strip().split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item}: {p} is not a table")
    node[parts[-1]] = value


__all__ = ["Config", "ConfigError", "load_config"]
