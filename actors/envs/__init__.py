"""Environments shipped with turnstream; importing this package registers them."""
from actors.envs import (follow_signs, goal_walk, http_env, math_tool, sokoban, tictactoe,  # noqa: F401
                          trivial)
