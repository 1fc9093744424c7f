"""Chat transcripts for the `turnstream sft` tests, and an environment that plays one back to an actor."""
from __future__ import annotations

from turnstream.actors.environment import Environment, Reset, Step


def transcript(turns: list[tuple[str, str]], system: str | None = None) -> dict:
    """{"messages": [...]} of (user, assistant) turns, opened by a system message if given."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages}


class Conversation(Environment):
    """Shows a transcript's user messages one after the other, whatever the replies, and records the replies
    (`actions`); the episode ends after the last."""

    def __init__(self, observations: list[str]):
        self.observations, self.actions = observations, []

    async def reset(self, seed, task=None):
        return Reset(self.observations[0], "|".join(self.observations))

    async def step(self, action):
        self.actions.append(action)
        done = len(self.actions) == len(self.observations)
        return Step("" if done else self.observations[len(self.actions)], 0.0, done)
