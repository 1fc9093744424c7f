"""Turn-level GAE (`turn_gae`): the critic read at turn boundaries, GAE across turns, each turn's advantage on its
action tokens (docs/estimators.md, "Turn-level GAE")."""
from __future__ import annotations

from turnstream.learner.estimators.value_based import ValueBased


class TurnGae(ValueBased):
    name = "turn_gae"
