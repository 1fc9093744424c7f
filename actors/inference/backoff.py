"""The pauses of a generate request between rounds of failed tries: doubling from a first delay up to a cap, each
drawn between half and all of its nominal length, so that the requests one outage failed together do not all
come back at the same instant."""
from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class RetryBackoff:
    first_s: float
    max_s: float
    rng: random.Random = field(default_factory=random.Random)
    pauses: int = 0

    def next_delay(self) -> float:
        nominal = min(self.max_s, self.first_s * 2 ** min(self.pauses, 32))
        self.pauses += 1
        return nominal * self.rng.uniform(0.5, 1.0)
