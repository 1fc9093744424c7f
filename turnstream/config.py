"""The run configuration: one TOML file, one table per role. Every field is documented here.

Ports set to 0 are chosen by the launcher (`turnstream up` / `demo`), which writes the resolved file
into the run directory and hands that file to every role.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from turnstream.configtools import ConfigError, check, dump_toml, from_dict, load_toml, to_dict


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


@dataclass
class VllmSection:
    urls: list[str] = field(default_factory=list)  # external servers; empty: the launcher starts them
    num_servers: int = 1
    base_port: int = 0
    max_num_seqs: int = 256
    max_model_len: int = 512
    kv_cache_gib: int = 1
    omp_threads: int = 1
    dtype: str = "float32"
    startup_timeout_s: float = 180.0
    extra_args: list[str] = field(default_factory=list)

    def validate(self, path: str) -> None:
        check(self.num_servers >= 1 or bool(self.urls), f"{path}.num_servers", "must be >= 1")
        check(self.max_num_seqs >= 1, f"{path}.max_num_seqs", "must be >= 1")
        check(self.kv_cache_gib >= 1, f"{path}.kv_cache_gib", "must be >= 1")


@dataclass
class EnvSection:
    name: str = "follow_signs"
    args: dict = field(default_factory=dict)  # passed to the environment's constructor

    def validate(self, path: str) -> None:
        from actors.env import known_envs, make_env

        check(self.name in known_envs(), f"{path}.name",
              f"unknown environment {self.name!r}; known: {', '.join(known_envs())}")
        try:
            make_env(self.name, **self.args)
        except TypeError as exc:
            raise ConfigError(f"{path}.args: {exc}") from None


@dataclass
class NetworkSection:
    host: str = "127.0.0.1"  # where roles bind and connect
    buffer_ingest_port: int = 0  # actors -> buffer (ROUTER)
    buffer_serve_port: int = 0  # learner -> buffer (ROUTER)
    learner_pub_port: int = 0  # learner -> everyone: version announcements (PUB)
    max_message_bytes: int = 64 * 1024 * 1024

    def validate(self, path: str) -> None:
        for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
            port = getattr(self, name)
            check(0 <= port < 65536, f"{path}.{name}", f"must be a TCP port in 0..65535, got {port}")


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

    def validate(self, path: str) -> None:
        check(self.num_processes >= 1, f"{path}.num_processes", "must be >= 1")
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

    def validate(self, path: str) -> None:
        check(self.batch_episodes >= 1, f"{path}.batch_episodes", "must be >= 1")
        check(self.eta >= 0, f"{path}.eta", "must be >= 0")
        check(self.max_staleness >= self.eta, f"{path}.max_staleness",
              f"must be >= eta ({self.eta}), or admitted episodes would be dropped as stale")
        check(self.max_items >= self.batch_episodes, f"{path}.max_items", "must be >= batch_episodes")


@dataclass
class SpoSection:
    rho_min: float = 0.875
    rho_max: float = 0.96
    d_half: float = 0.06
    normalize: Literal["token", "sequence"] = "token"  # SPO++ action-token measure, or SPO's per-episode


@dataclass
class LearnerSection:
    estimator: Literal["spo"] = "spo"
    lr: float = 3e-4
    warmup_steps: int = 0  # optimizer steps of linear learning-rate warm-up
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    behaviour_weight_cap: float = 2.0  # truncated IS on pi_prox / mu
    entropy_coef: float = 0.0  # bonus on the sampling distribution's entropy (allowed-token set)
    minibatches: int = 1
    epochs: int = 1
    max_steps: int = 0  # 0: run until stopped
    torch_threads: int = 1
    weights_dir: str = ""  # where pushed weights are written; empty: <run_dir>/weights
    keep_weight_versions: int = 2
    metrics_port: int = 0
    spo: SpoSection = field(default_factory=SpoSection)

    def validate(self, path: str) -> None:
        check(self.lr > 0, f"{path}.lr", "must be > 0")
        check(0 < self.clip_low < 1, f"{path}.clip_low", "must be in (0, 1)")
        check(self.clip_high > 0, f"{path}.clip_high", "must be > 0")
        check(self.behaviour_weight_cap >= 1, f"{path}.behaviour_weight_cap", "must be >= 1")
        check(self.minibatches >= 1 and self.epochs >= 1, f"{path}.minibatches", "minibatches and epochs must be >= 1")
        check(self.keep_weight_versions >= 1, f"{path}.keep_weight_versions", "must be >= 1")


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
