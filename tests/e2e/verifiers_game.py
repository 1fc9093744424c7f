"""A small multi-turn verifiers environment for the tests (it runs in .venv-verifiers, inside the harness
worker: it imports verifiers and datasets, never turnstream or pytest). Nothing is downloaded: the dataset is
built in memory.

Three assistant turns; after each reply the environment answers with a user message that names the turn.
The rubric scores what the model wrote, so the reward is checkable from the generated tokens: one hundredth
of the characters of the assistant replies. For the error paths, a row can fail in the environment's code
after the first turn (`boom_rows`), fail before any call (`setup_boom_rows`) or never start (`stall_rows`).
"""
import asyncio
from typing import Literal

import verifiers as vf
from datasets import Dataset

WORDS = ["apple", "river", "stone", "cloud"]


def _content(message) -> str:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    return content if isinstance(content, str) else ""


def _role(message) -> str:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", "")


def characters_written(completion, **kwargs) -> float:
    return sum(len(_content(m)) for m in completion if _role(m) == "assistant") / 100


class GuessGame(vf.MultiTurnEnv):
    async def setup_state(self, state, **kwargs):
        info = state.get("info") or {}
        if info.get("setup_boom"):
            raise RuntimeError("the environment failed before the first call")
        if info.get("stall"):
            await asyncio.sleep(3600)
        return state

    async def env_response(self, messages, state, **kwargs):
        turn = len(state["trajectory"])
        if (state.get("info") or {}).get("boom"):
            raise RuntimeError(f"the environment failed after turn {turn}")
        return [{"role": "user", "content": f"not yet ({turn}); guess again"}]


def load_environment(rows: int = len(WORDS), boom_rows: tuple = (), setup_boom_rows: tuple = (),
                     stall_rows: tuple = (), max_turns: int = 3) -> vf.Environment:
    dataset = Dataset.from_list([
        {"question": f"Guess my word ({i}).", "answer": WORDS[i % len(WORDS)],
         "info": {"boom": i in boom_rows, "setup_boom": i in setup_boom_rows, "stall": i in stall_rows}}
        for i in range(rows)])
    return GuessGame(dataset=dataset, system_prompt="You play a guessing game.", max_turns=max_turns,
                     rubric=vf.Rubric(funcs=[characters_written]))


CITIES = ["paris", "rome", "oslo"]


def weather(city: Literal["paris", "rome", "oslo"]) -> str:
    """Today's weather in a city.

    Args:
        city: the city, one of paris, rome, oslo
    """
    return f"sunny in {city}"


def asked_city_first(completion, answer, **kwargs) -> float:
    """1 when the first tool call asked for the task's city."""
    import json

    for m in completion:
        calls = m.get("tool_calls") if isinstance(m, dict) else getattr(m, "tool_calls", None)
        if calls:
            call = calls[0]
            arguments = call.get("arguments") if isinstance(call, dict) else getattr(call, "arguments", "")
            return 1.0 if json.loads(arguments).get("city") == answer else 0.0
    return 0.0


def load_tool_environment(max_turns: int = 2) -> vf.Environment:
    """A ToolEnv over the weather tool: the rollout's calls come back to the model as `tool` messages."""
    dataset = Dataset.from_list([{"question": f"weather in {c}?", "answer": c} for c in CITIES])
    return vf.ToolEnv(dataset=dataset, tools=[weather], max_turns=max_turns,
                      rubric=vf.Rubric(funcs=[asked_city_first]))
