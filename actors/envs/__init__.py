"""Environments shipped with turnstream; importing this package registers them."""
from turnstream.actors.envs import (fixed_odds, follow_signs, follow_signs_longtail, goal_walk,  # noqa: F401
                                   http_env, math_tool, sokoban, tictactoe, trail, trivial)
