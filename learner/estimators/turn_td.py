"""Turn-level TD (`turn_td`): turn_gae with one-step temporal-difference targets and advantages (lambda = 0), which
may also learn from older episodes served to the critic alone (buffer.critic_replay; docs/estimators.md,
"turn_td")."""
from __future__ import annotations

from turnstream.learner.estimators.turn_gae import TurnGae


class TurnTd(TurnGae):
    name = "turn_td"

    @property
    def lam(self) -> float:
        return 0.0
