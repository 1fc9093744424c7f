"""Where the actor's OpenAI-compatible endpoint listens and what its episodes' base URLs name (actor.endpoint_*):
two hosts, since an endpoint bound to every interface (0.0.0.0) is reached at one of them, which only the
config can tell."""
from __future__ import annotations

from dataclasses import dataclass

from turnstream.core.config import Config


@dataclass(frozen=True)
class EndpointAddress:
    bind_host: str = "127.0.0.1"
    url_host: str = "127.0.0.1"  # the host each episode's base URL names, for the agent to connect to
    port: int = 0  # 0: a free port the OS chooses

    @classmethod
    def for_actor(cls, cfg: Config, actor_index: int) -> EndpointAddress:
        """Actor `actor_index`'s endpoint under `cfg`: actor i listens on endpoint_port + i; ConfigError when
        the endpoint binds every interface and no setting names an address agents reach."""
        a = cfg.actor
        return cls(a.endpoint_bind_host, a.endpoint_url_host(cfg.network),
                   a.endpoint_port + actor_index if a.endpoint_port else 0)
