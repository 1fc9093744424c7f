"""Environments shipped with turnstream; importing this package registers them."""
from turnstream.actors.envs import (follow_signs, follow_signs_longtail, goal_walk, http_env, math_tool,  # noqa: F401
                          sokoban, tictactoe, trivial)
