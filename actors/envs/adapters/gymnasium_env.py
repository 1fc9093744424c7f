"""`gymnasium`: Gymnasium environments through a text mapping (gymnasium_mappings.py).

The mapping turns each observation into text and each reply into an action; the environment's own
reward, `terminated` (done) and `truncated` (its TimeLimit, or `max_episode_steps`) pass through. A reply
that names no valid action is not sent to the environment: the agent is told so, with the list of
actions, and gets `invalid_action_reward`; after `max_invalid_actions` such replies in one episode it ends
as truncated with `info["reason"] = "invalid_actions"`. An exception from the environment abandons the
episode as an `EnvError` of kind `library`. `success` is a termination with a positive reward, or the
environment's own `info["is_success"]`.

Tasks: `tasks = n` enumerates n starting states: task i starts where `reset(seed=i)` does (Taxi's taxi,
passenger and destination, Blackjack's deal), prompt_key `gymnasium/<env_id>/<i>`, and the episode seed then
reseeds the environment's generator for what is random after the start (a slippery lake's slides, the cards
drawn). An environment with one start (FrozenLake on a fixed map) has exactly one task, `tasks = 1`. With
`tasks = 0` (the default) it does not enumerate: the episode seed draws the start and every episode shares
the key `gymnasium/<env_id>`. See docs/adapters/gymnasium.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from turnstream.actors.environment import EnvError, Environment, Reset, Step
from turnstream.actors.envs.adapters.common import check_task, describe, library_errors, require
from turnstream.actors.envs.adapters.gymnasium_mappings import default_mapping_name, load_mapping

LIBRARY, EXTRA = "gymnasium", "gymnasium"
_DEFAULT_MAPPING: dict[str, str] = {}  # env id -> the built-in mapping its spaces call for


@dataclass
class GymnasiumArgs:
    env_id: str = "FrozenLake-v1"
    make_kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make, e.g. {"is_slippery": false}
    mapping: str = ""  # built-in name (text, discrete, frozenlake, taxi, blackjack) or "pkg.mod:Name"; "": by env
    mapping_args: dict = field(default_factory=dict)  # constructor arguments of a mapping class
    max_episode_steps: int | None = None  # None: the environment's registered limit
    restrict_actions: bool = True  # sample only the mapping's action tokens when it declares them
    max_invalid_actions: int = 3
    invalid_action_reward: float = 0.0
    tasks: int = 0  # starts to enumerate, task i as reset(seed=i) (1 for an environment with one start); 0: none

    def validate(self) -> None:
        if self.max_invalid_actions < 1:
            raise ValueError(f"gymnasium: max_invalid_actions must be >= 1, got {self.max_invalid_actions}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError("gymnasium: max_episode_steps must be >= 1")
        if self.tasks < 0:
            raise ValueError(f"gymnasium: tasks must be >= 0, got {self.tasks}")


class GymnasiumEnv(Environment):
    def __init__(self, **kwargs):
        self.args = GymnasiumArgs(**kwargs)
        self.args.validate()
        self.gym = require(LIBRARY, EXTRA)
        try:
            self.spec = self.gym.spec(self.args.env_id)
        except self.gym.error.Error as exc:
            raise ValueError(f"gymnasium: {self.args.env_id}: {exc}") from None
        self.mapping = load_mapping(self.args.mapping or self._default_mapping(), self.args.mapping_args)
        self._take_sampling_limits()
        self.num_tasks = self.args.tasks or None
        self.env = None
        self.invalid = 0
        self.last_text = ""

    @classmethod
    def description(cls) -> str:
        return describe("Gymnasium environments: text observations, or discrete actions through a text "
                        "mapping (FrozenLake, Taxi, Blackjack built in)", LIBRARY, EXTRA)

    def _default_mapping(self) -> str:
        """The built-in mapping that fits the environment's spaces (made once per process to look)."""
        if self.args.env_id not in _DEFAULT_MAPPING:
            try:
                probe = self._make()
            except Exception as exc:
                raise ValueError(f"gymnasium: {self.args.env_id} with {self.args.make_kwargs} cannot be made: "
                                 f"{type(exc).__name__}: {exc}") from None
            try:
                _DEFAULT_MAPPING[self.args.env_id] = default_mapping_name(
                    self.args.env_id, probe.observation_space, probe.action_space)
            finally:
                probe.close()
        return _DEFAULT_MAPPING[self.args.env_id]

    def _take_sampling_limits(self) -> None:
        self.max_action_tokens = int(getattr(self.mapping, "max_action_tokens", self.max_action_tokens))
        tokens = getattr(self.mapping, "action_tokens", None)
        self.action_tokens = list(tokens) if tokens and self.args.restrict_actions else None

    def _make(self):
        kwargs = dict(self.args.make_kwargs)
        if self.args.max_episode_steps is not None:
            kwargs["max_episode_steps"] = self.args.max_episode_steps
        return self.gym.make(self.args.env_id, **kwargs)

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        await self.close()
        start = seed if task is None else check_task(LIBRARY, task, self.num_tasks)
        with library_errors(LIBRARY, f"{self.args.env_id} reset"):
            self.env = self._make()
            observation, info = self.env.reset(seed=start)
            if task is not None:  # the task fixed the start; the episode seed draws what comes after it
                self.env.unwrapped.np_random = self.gym.utils.seeding.np_random(seed)[0]
            self.last_text = self.mapping.observation_text(observation, info, self.env)
        self.invalid = 0
        key = f"gymnasium/{self.args.env_id}" + ("" if task is None else f"/{task}")
        return Reset(self.last_text, prompt_key=key)

    def _valid(self, action) -> bool:
        try:
            return action is not None and bool(self.env.action_space.contains(action))
        except Exception:  # a space that cannot even compare the value rejects it
            return False

    async def step(self, reply: str) -> Step:
        if self.env is None:
            raise EnvError("gymnasium: step before reset", "protocol")
        with library_errors(LIBRARY, "mapping the reply to an action"):
            action = self.mapping.action(reply, self.env)
        if not self._valid(action):
            self.invalid += 1
            info = {"success": False, "invalid_action": reply, "invalid_actions": self.invalid}
            if self.invalid >= self.args.max_invalid_actions:
                info["reason"] = "invalid_actions"
                return Step("too many invalid actions", self.args.invalid_action_reward, done=True,
                            truncated=True, info=info)
            helper = getattr(self.mapping, "action_help", None)
            hint = helper(self.env) if callable(helper) else "reply with a valid action"
            return Step(f"invalid action {reply.strip()[:40]!r}: {hint}\n{self.last_text}",
                        self.args.invalid_action_reward, done=False, info=info)
        with library_errors(LIBRARY, f"{self.args.env_id} step"):
            observation, reward, terminated, truncated, info = self.env.step(action)
            self.last_text = self.mapping.observation_text(observation, info, self.env)
        reward = float(reward)
        success = bool(info.get("is_success", terminated and reward > 0))
        out_info = {"success": success, "terminated": bool(terminated)}
        if truncated and not terminated:
            out_info["reason"] = "time_limit"
        return Step(self.last_text, reward, done=bool(terminated or truncated),
                    truncated=bool(truncated and not terminated), info=out_info)

    async def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            try:
                env.close()
            except Exception:  # a crashed environment has nothing left to free
                pass
