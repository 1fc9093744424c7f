"""A long trail: 50 turns and more, a reward at every marker and a bonus for the end (the long-horizon task).

The trail has `length` markers (default 50), each with a sign, L or R. Every turn the observation shows how
many turns the budget has left and the sign of the next marker ("37 L"); the agent answers one token, L or
R. Following the sign moves it on to the next marker and pays `(1 - bonus) / length`; the other answer pays
nothing and leaves it where it was (the same sign comes again, with one turn fewer left), so a mistake costs
a turn of the budget, not the episode. Reaching the end pays the terminal `bonus` (default 0.5) on top and ends the
episode with success; the episode also ends, without success and without the bonus, when the turn budget
(`length` plus `slack` of it, rounded up: 60 turns for 50 markers) is spent. The budget is part of the task,
like goal_walk's, so that end is `done`, not `truncated`. Returns lie in [0, 1] (SPO reads them as success
evidence) and are exactly 1 on success.

The signs are drawn independently per marker, so a policy blind to the observation follows each sign with
probability 1/2 and the only way to the bonus is to read the sign on every turn; the sign is the
observation's last token, a fixed few tokens before the action. The number in front is for the critic, not
needed by the policy: how many turns are left is what a turn's value depends on (each turn earns about the
same). The markers still to go would confound progress with time: under a random policy the value of "N to
go" falls by one marker's pay per marker, so a critic that learned it would give a correct answer (one
marker closer) the same advantage as a wrong one, and turn_gae would have no signal.

Measured by simulation (20,000 episodes per policy, defaults; tests/unit/test_env_long_horizon.py checks
them on 3,000):
- following every sign: 50 turns, return 1.0, success 1;
- uniformly random: 60 turns (the budget; finishing needs 50 right of 60, p ~ 1e-7), return 0.30 (30 markers
  of 50), success 0;
- following the sign with probability 0.9: 55.5 turns, return 0.98, success 0.97; with 0.85: return 0.85,
  success 0.72; with 0.8: return 0.64, success 0.32. A rolling success of 0.9 asks about 0.88 a turn.
Tokens (actors/inference/chat_tokens.py and the tiny model's tokenizer, through the environment loop): every
observation is 2 tokens ("37 L"), a turn 13 with the chat template and the action, so an episode of T turns
holds 13 T - 2 tokens: 648 for the 50 turns of a perfect episode, 778 for the 60 of a spent budget, within
the benches' max_model_len of 1024 (at most 78 turns would fit).

Tasks: `tasks` sign sequences (default 64), task i's drawn from a generator seeded with i, prompt key
"trail/<i>"; a reset without a task takes one from the seed. The episode is the same for every seed.

The long-tail variant, `trail_longtail` (or `long_length` and `long_fraction` on `trail`): a fraction
`long_fraction` of the tasks (a seeded choice: 6 of 64 at 0.1) have `long_length` markers, the others
`length`; its defaults are 10 and 50 markers, so most episodes take 10-12 turns and about one in ten 50-60,
five times as many, which an episode-level estimator's batch or group waits for. Measured as above: following
every sign 13.75 turns on average (median 10); uniformly random 16.5 turns, return 0.31, success 0.017 (the
short tasks finish with 10 right of 12 now and then); following the sign with probability 0.9: success 0.90.
"""
from __future__ import annotations

import math
import random

from turnstream.actors.environment import Environment, Reset, Step, register


@register("trail")
class Trail(Environment):
    action_tokens = ["L", "R"]
    max_action_tokens = 1
    name = "trail"  # prompt_key's prefix

    def __init__(self, length: int = 50, slack: float = 0.2, bonus: float = 0.5, tasks: int = 64,
                 long_length: int = 0, long_fraction: float = 0.1):
        if length < 1 or slack < 0 or not 0 <= bonus <= 1 or tasks < 1:
            raise ValueError("length and tasks must be >= 1, slack >= 0, bonus in [0, 1]")
        if long_length < 0 or not 0 <= long_fraction <= 1:
            raise ValueError("long_length must be >= 0 (0: no long tasks), long_fraction in [0, 1]")
        self.length, self.slack, self.bonus, self.num_tasks = length, slack, bonus, tasks
        self.long_length = long_length
        n_long = round(long_fraction * tasks) if long_length else 0
        self.long_tasks = frozenset(random.Random(f"{self.name}/long").sample(range(tasks), n_long))
        self.signs = ""
        self.pos = 0  # markers passed
        self.turn = 0
        self.max_turns = 0

    def task_signs(self, task: int) -> str:
        """Task `task`'s signs, one per marker: the same in every process (a string seed)."""
        if not 0 <= task < self.num_tasks:
            raise ValueError(f"task {task} out of range [0, {self.num_tasks})")
        rng = random.Random(f"trail/{task}")
        n = self.long_length if task in self.long_tasks else self.length
        return "".join(rng.choice("LR") for _ in range(n))

    def budget(self, markers: int) -> int:
        return markers + math.ceil(self.slack * markers)

    async def reset(self, seed: int, task: int | None = None) -> Reset:
        if task is None:
            task = random.Random(seed).randrange(self.num_tasks)
        self.signs = self.task_signs(task)
        self.pos, self.turn, self.max_turns = 0, 0, self.budget(len(self.signs))
        return Reset(observation=self._observation(), prompt_key=f"{self.name}/{task}")

    def _observation(self) -> str:
        return f"{self.max_turns - self.turn} {self.signs[self.pos]}"

    async def step(self, action: str) -> Step:
        reward = 0.0
        if action.strip() == self.signs[self.pos]:
            self.pos += 1
            reward = (1.0 - self.bonus) / len(self.signs)
        self.turn += 1
        if self.pos == len(self.signs):
            return Step(observation="end", reward=reward + self.bonus, done=True, info={"success": True})
        if self.turn >= self.max_turns:
            return Step(observation="end", reward=reward, done=True, info={"success": False})
        return Step(observation=self._observation(), reward=reward, done=False)


@register("trail_longtail")
class TrailLongtail(Trail):
    """The trail with long-tailed lengths: one task in ten five times as long as the rest."""

    name = "trail_longtail"

    def __init__(self, length: int = 10, slack: float = 0.2, bonus: float = 0.5, tasks: int = 64,
                 long_length: int = 50, long_fraction: float = 0.1):
        super().__init__(length, slack, bonus, tasks, long_length, long_fraction)
