"""Follow the signs with long-tailed episode lengths: the async-vs-sync benchmark's straggler task.

The learnable signal is exactly follow_signs': `k` junctions (k drawn from `junctions`), each showing a
sign L or R, reward 1 only if every sign was followed, given after the last turn. Between the junctions
the agent walks through `c` corridor turns ("corridor 3 no sign") where either answer is fine. `c` is
drawn per episode from a discrete Lomax (Pareto II) distribution, capped at `max_corridor`, so most
episodes are a few turns long and a few are many times the median, as agent tasks with tool calls or
retries are. With the defaults and junctions 2-4: median 4 turns, mean 4.6, 95th percentile 12, 99th 27
(the cap, 28); 85% of batches of 64 episodes hold one of 20 turns or more. A synchronous batch waits for
its longest episode; that is the cost asynchrony removes.

The defaults keep the mean short on purpose: every corridor token is trained with the episode's
advantage, which is noise for it, and dilutes the junction tokens' share of a token-mean loss (3 of 4.6
tokens here), so a fatter body slows learning down.

Why corridors and not more junctions: more junctions would make long episodes almost never succeed
(2^-k at the start), which changes what is learned, not only how long it takes. Corridor turns keep the
success rate of a policy a function of the junctions alone, so success is comparable to follow_signs.
The corridor layout is left out of `prompt_key`: the task instance, for per-prompt baselines, is the sign
sequence.
"""
from __future__ import annotations

import math
import random

from turnstream.actors.environment import register
from turnstream.actors.envs.tasks.follow_signs import FollowSigns


def corridor_length(rng: random.Random, scale: float, alpha: float, cap: int) -> int:
    """floor of a Lomax(alpha, scale) draw, capped: P(c >= x) = (1 + x/scale)^-alpha, a power-law tail."""
    u = 1.0 - rng.random()  # in (0, 1], so the power below is finite
    return min(cap, math.floor(scale * (u ** (-1.0 / alpha) - 1.0)))


@register("follow_signs_longtail")
class FollowSignsLongtail(FollowSigns):
    name = "follow_signs_longtail"

    def __init__(self, junctions: list[int] | None = None, corridor_scale: float = 0.5,
                 corridor_alpha: float = 1.0, max_corridor: int = 24):
        if corridor_scale <= 0 or corridor_alpha <= 0 or max_corridor < 0:
            raise ValueError("corridor_scale and corridor_alpha must be > 0, max_corridor >= 0")
        super().__init__(junctions)
        self.corridor_scale, self.corridor_alpha, self.max_corridor = corridor_scale, corridor_alpha, max_corridor

    def _plan(self, rng: random.Random) -> list[str | None]:
        k = len(self.signs)
        c = corridor_length(rng, self.corridor_scale, self.corridor_alpha, self.max_corridor)
        # the last turn is always a junction, so the reward arrives on a turn that mattered
        corridor_at = set(rng.sample(range(k + c - 1), c))
        signs = iter(self.signs)
        return [None if t in corridor_at else next(signs) for t in range(k + c)]
