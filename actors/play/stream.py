"""One agent's side of an episode: the token stream it sends the buffer, chunk by chunk."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stream:
    """What the actor keeps of one agent's conversation while its episode plays."""

    episode_id: str
    prompt_key: str
    agent: int
    context: list[int] = field(default_factory=list)
    last_gen: list[int] | None = None  # None until the agent has acted once
    in_context: int = 0  # turns the context holds
    turn: int = 0  # chunks sent on this stream
    last_seq: int = -1  # the link's sequence number of the last chunk sent
    pending_reward: float = 0.0  # rewards given to this agent since its last chunk
