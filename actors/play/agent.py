"""A user's agent function, trained as it is: `async def solve(client, task) -> float` over the OpenAI client.

    [env]
    name = "agent"
    args = { entry = "my_pkg.agents:solve", tasks = "my_pkg.agents:TASKS" }

`entry` names the function (module path, colon, attribute); the module must be importable by the actor
process. `tasks`, optional, is a list of tasks or the "module:attribute" of one (a list, or a function
returning one): each episode's task is one of them (the environment enumerates them, for sequential
orders, groups and evaluation), and the episode's prompt key is `task-<index>`. Without `tasks` the task
is the episode's seed (an int). The function gets an `openai.AsyncOpenAI` client bound to the episode on
the actor's endpoint (play/endpoint/); its return value is the reward, and an episode is a success when the
reward is at least `success_at`. `timeout_s` bounds one episode (0: no limit).

The function runs on the actor's event loop (env.isolation = "loop"; "process" cannot apply). Its own work is
held to the run's time limits: before its first chat call env.reset_timeout_s, from a reply to its next call or
its return env.step_timeout_s; code of it that blocks the loop is measured and watched like an environment's
(actors/envs/guard/watchdog.py).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
from typing import Any, Awaitable, Callable

from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.envs.guard.timed import LoopBlockMeter
from turnstream.actors.play.context import PlayContext
from turnstream.actors.play.endpoint.server import OpenAIEndpoint
from turnstream.actors.play.endpoint.session import TurnLimits, play_at_endpoint
from turnstream.actors.play.player import Episode, EpisodePlayer
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
    """The tasks "module:attribute" names, loaded once per process (the start-up checks make a player too)."""
    tasks = load_entry(spec, "tasks")
    tasks = tasks() if callable(tasks) else tasks
    if not isinstance(tasks, (list, tuple)):
        raise ConfigError(f"env.args.tasks: {spec!r} is not a list of tasks (nor a function returning one)")
    return tuple(tasks)


class AgentPlayer(EpisodePlayer):
    """A user's async agent function over the OpenAI client (env.args.entry = "pkg.mod:solve")"""

    isolations = ("loop",)
    isolation_note = ("the agent function runs on the actor's event loop, where its chat calls are served; use "
                      "\"loop\"")

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
        self.guarded_by(GuardSettings("agent"))

    def guarded_by(self, guard: GuardSettings) -> str:
        self.limits = TurnLimits(guard.reset_timeout_s, guard.step_timeout_s)
        self.meter = LoopBlockMeter(guard.loop_block_warn_s)
        return (f'the agent function runs on the actor\'s event loop (env.isolation = "loop"); its own work has '
                f"{guard.reset_timeout_s:g}s before its first chat call (env.reset_timeout_s) and {guard.step_timeout_s:g}s "
                f"from a reply to its next call or its return (env.step_timeout_s), held by the loop watchdog too")

    def startup_env(self) -> "AgentPlayer":
        return self

    async def play(self, ctx: PlayContext, episode: Episode) -> str:
        seed, task = episode.seed, episode.task
        if self.tasks is None:
            value, key = seed, f"seed-{seed}"
        else:
            index = seed % len(self.tasks) if task is None else task
            value, key = self.tasks[index], f"task-{index}"
        limits = self.limits

        def solve(client, task) -> Awaitable:  # measured and watched like an environment's step on the loop
            return self.meter.timed(self.solve(client, task), "agent", "step", limits.between_s, ctx.metrics)

        return await play_agent(ctx, episode, solve, value, prompt_key=key, success_at=self.success_at,
                                timeout_s=self.timeout_s, limits=limits)


async def play_agent(ctx: PlayContext, episode: Episode, solve: Callable[..., Awaitable], task, *, prompt_key: str,
                     success_at: float, timeout_s: float, limits: TurnLimits = TurnLimits()) -> str:
    """Play `episode` of `task` with the user's `solve(client, task)`; the outcome."""
    import openai  # the integrations extra; AgentPlayer checked at construction that it is there

    async def run(endpoint: OpenAIEndpoint, base_url: str):
        if endpoint.http_client is None:
            # one connection pool for every episode's client, on aiohttp (openai's own DefaultAioHttpClient):
            # httpx's pool and h11 parser take more CPU a call, taken from generation. Its time limit is twice
            # a generate call's: a turn may wait for a server to come back, then generate
            endpoint.http_client = openai.DefaultAioHttpClient(timeout=ctx.request_timeout_s * 2)
            quiet_request_logs()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="turnstream", http_client=endpoint.http_client)
        return await solve(client, task)

    return await play_at_endpoint(ctx, episode, run, prompt_key=prompt_key, success_at=success_at,
                                  timeout_s=timeout_s, limits=limits)


def quiet_request_logs() -> None:
    """The openai client's transport (httpx, httpx2 from openai 3) logs every request at INFO: a line per turn
    in the actor's log, and its CPU taken from the turns. Left as they are when the user set their level."""
    for name in ("httpx", "httpx2"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
