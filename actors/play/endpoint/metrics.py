"""Prometheus metrics of the actor's OpenAI-compatible endpoint, registered on the actor's registry when its
first endpoint episode starts."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.requests = Counter("turnstream_actor_openai_requests_total",
                                "Requests to the OpenAI-compatible endpoint, by HTTP status", ["status"], registry=r)
        self.bad_requests = Counter("turnstream_actor_openai_bad_requests_total",
                                    "Requests the OpenAI-compatible endpoint rejected, by reason", ["reason"],
                                    registry=r)
        self.segments = Counter("turnstream_actor_agent_segments_total",
                                "Restarted contexts of agent episodes: a caller's history did not continue the "
                                "recorded tokens", registry=r)
        self.agent_errors = Counter("turnstream_actor_agent_errors_total",
                                    "Agent episodes abandoned because the user's function failed, by reason",
                                    ["reason"], registry=r)
