"""Environments shipped with turnstream; importing this package registers them."""
from actors.envs import goal_walk  # noqa: F401
