"""Environments: the interface is actors/environment.py, the names are looked up in actors/envs/registry.py.

    tasks/     the shipped environments: follow_signs (the demo), its longtail and latency variants, goal_walk,
               trail, sokoban, tictactoe, math_tool (with its sandbox); arithmetic and guess_number, free-text
               tasks for a pretrained chat model
    probes/    test probes: trivial (throughput), fixed_odds (what a task order or curriculum does), and
               misbehaving ones (probe_hang, probe_block, probe_crash, probe_slow_tool, probe_memory, probe_child)
    remote/    environments served over HTTP (HTTP_ENV.md): the `http` client and a reference server
    adapters/  established libraries (TextArena, TextWorld, reasoning-gym, Gymnasium), as entry points
    guard/     guarding the actor from its environments: time limits, loop-block watchdog, process isolation

Importing this package registers the built-ins of tasks/, probes/ and remote/.
"""
from turnstream.actors.envs.probes import fixed_odds, misbehaving, trivial  # noqa: F401
from turnstream.actors.envs.remote import http_env  # noqa: F401
from turnstream.actors.envs.tasks import (arithmetic, follow_signs, follow_signs_latency,  # noqa: F401
                                         follow_signs_longtail, goal_walk, guess_number, math_tool, sokoban,
                                         tictactoe, trail)
