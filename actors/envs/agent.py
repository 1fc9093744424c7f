"""A user's agent function, trained as it is: `async def solve(client, task) -> float` over the OpenAI client.

    [env]
    name = "agent"
    args = { entry = "my_pkg.agents:solve", tasks = "my_pkg.agents:TASKS" }

`entry` names the function (module path, colon, attribute); the module must be importable by the actor
process. `tasks`, optional, is a list of tasks or the "module:attribute" of one (a list, or a function
returning one): each episode's task is one of them (the environment enumerates them, for sequential
orders, groups and evaluation), and the episode's prompt key is `task-<index>`. Without `tasks` the task
is the episode's seed (an int). The function gets an `openai.AsyncOpenAI` client bound to the episode
(actors/agent_runner.py); its return value is the reward, and an episode is a success when the reward is at
least `success_at`. `timeout_s` bounds one episode (0: no limit).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

from turnstream.actors.environment import Environment
from turnstream.core.configtools import ConfigError


def load_entry(spec: str, field: str) -> Any:
    """The object "module:attribute" names; ConfigError naming `field` otherwise."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ConfigError(f"env.args.{field}: {spec!r} is not \"module:attribute\"")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"env.args.{field}: cannot load {spec!r}: {exc}") from None
    return obj


@functools.cache
def _task_list(spec: str) -> tuple:
    """The tasks "module:attribute" names, loaded once per process: the runner builds an environment per episode."""
    tasks = load_entry(spec, "tasks")
    tasks = tasks() if callable(tasks) else tasks
    if not isinstance(tasks, (list, tuple)):
        raise ConfigError(f"env.args.tasks: {spec!r} is not a list of tasks (nor a function returning one)")
    return tuple(tasks)


class AgentEnv(Environment):
    """A user's async agent function over the OpenAI client (env.args.entry = "pkg.mod:solve")"""

    def __init__(self, entry: str = "", tasks: list | str | None = None, success_at: float = 1.0,
                 timeout_s: float = 600.0):
        if not entry:
            raise ConfigError('env.args.entry: the agent environment needs entry = "module:function"')
        try:
            import openai  # noqa: F401  (the client the user's function receives)
        except ImportError:
            raise ConfigError("env.args.entry: the agent environment needs the openai package; install "
                              "turnstream[integrations]") from None
        self.solve = load_entry(entry, "entry")
        if not inspect.iscoroutinefunction(self.solve):
            raise ConfigError(f"env.args.entry: {entry!r} must be an async function solve(client, task)")
        if isinstance(tasks, str):
            tasks = _task_list(tasks)
        if tasks is not None and (not isinstance(tasks, (list, tuple)) or not tasks):
            raise ConfigError("env.args.tasks: must be a non-empty list of tasks (or name one)")
        self.tasks = None if tasks is None else list(tasks)
        self.num_tasks = None if tasks is None else len(self.tasks)
        self.success_at, self.timeout_s = float(success_at), float(timeout_s)

    async def drive(self, runner, episode_id: str, seed: int, task: int | None, streams: dict) -> str:
        """Play the episode (the runner calls this instead of reset and step)."""
        from turnstream.actors.agent_runner import play_agent

        if self.tasks is None:
            value, key = seed, f"seed-{seed}"
        else:
            index = seed % len(self.tasks) if task is None else task
            value, key = self.tasks[index], f"task-{index}"
        return await play_agent(runner, self.solve, value, episode_id=episode_id, prompt_key=key, streams=streams,
                                success_at=self.success_at, timeout_s=self.timeout_s)

    async def reset(self, seed: int, task: int | None = None):
        raise NotImplementedError("an agent episode is driven by its function (drive), not by reset and step")
