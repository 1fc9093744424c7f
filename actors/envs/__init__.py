"""Environments shipped with turnstream; importing this package registers them."""
from actors.envs import follow_signs, goal_walk  # noqa: F401
