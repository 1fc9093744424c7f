"""Shipped environments (Sokoban, math tool with its sandbox, tic-tac-toe) and the entry-point registry."""
from __future__ import annotations

import sys
import textwrap

import pytest

from turnstream.actors.envs.registry import known_envs, make_env
from turnstream.actors.envs import sokoban
from turnstream.actors.envs.tasks.math_tool import parse_action
from turnstream.actors.envs.tasks.sandbox import evaluate


# ---- Sokoban -----------------------------------------------------------------------------------------

def test_sokoban_boards_are_seeded_solvable_and_not_solved():
    for seed in range(30):
        walls, targets, boxes, player = sokoban.generate(seed)
        assert sokoban.generate(seed) == (walls, targets, boxes, player)  # same seed, same board
        assert boxes != targets and player not in walls and not boxes & walls
        assert sokoban.solve(walls, targets, boxes, player) >= 1
    assert sokoban.generate(1) != sokoban.generate(2)


def test_sokoban_solver_detects_unsolvable():
    walls = {(r, c) for r in range(5) for c in range(5) if r in (0, 4) or c in (0, 4)}
    # a box in a corner that is not a target can never move again
    assert sokoban.solve(walls, {(2, 2)}, {(1, 1)}, (3, 3)) is None


async def _solve_by_bfs_moves(env: sokoban.Sokoban) -> list:
    """Replay a shortest solution found by searching over moves, returning the steps."""
    from collections import deque

    start = (frozenset(env.boxes), env.player)
    parent = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if state[0] == env.targets:
            break
        for move in sokoban.MOVES:
            out = sokoban.push(env.walls, set(state[0]), state[1], move)
            if out and (nxt := (frozenset(out[0]), out[1])) not in parent:
                parent[nxt] = (state, move)
                queue.append(nxt)
    moves = []
    while parent[state] is not None:
        state, move = parent[state]
        moves.append(move)
    return [await env.step(m) for m in reversed(moves)]


async def test_sokoban_rewards_per_turn_and_terminal():
    env = make_env("sokoban", max_steps=50)
    reset = await env.reset(7)
    assert reset.observation.count("\n") == 5 and "P" in reset.observation
    steps = await _solve_by_bfs_moves(env)
    assert steps[-1].done and not steps[-1].truncated and steps[-1].info["success"]
    assert steps[-1].reward > 1.0  # +1 solved, +0.1 box on target, -0.01 move
    assert all(s.reward == pytest.approx(-0.01) or s.reward == pytest.approx(-0.11) for s in steps[:-1])


async def test_sokoban_truncates_after_max_steps():
    env = make_env("sokoban", max_steps=3)
    await env.reset(0)
    steps = [await env.step("bogus") for _ in range(3)]
    assert [s.done for s in steps] == [False, False, True] and steps[-1].truncated


# ---- sandbox and math tool ---------------------------------------------------------------------------

async def test_sandbox_evaluates_arithmetic():
    r = await evaluate("37*48-19")
    assert r.ok and r.text == "1757"
    r = await evaluate("sum(i*i for i in range(10))")
    assert r.ok and r.text == "285"


@pytest.mark.parametrize("expression, fragment", [
    ("__import__('os').system('true')", "not allowed"),
    ("open('/etc/passwd').read()", "not allowed"),
    ("().__class__", "not allowed"),
    ("x", "unknown name"),
    ("'a' * 3", "only numbers"),
    ("1/0", "ZeroDivisionError"),
    ("1 +", "SyntaxError"),
])
async def test_sandbox_rejects_unsafe_or_bad_input(expression, fragment):
    r = await evaluate(expression)
    assert not r.ok and fragment in r.text


async def test_sandbox_cpu_and_wall_limits():
    r = await evaluate("sum(range(10**12))", cpu_s=1, wall_s=10.0)
    assert not r.ok and ("cpu" in r.text or "time" in r.text)
    r = await evaluate("sum(range(10**12))", cpu_s=30, wall_s=0.5)
    assert not r.ok and r.text == "error time limit"


async def test_sandbox_memory_limit():
    r = await evaluate("len([0] * 10**9)", memory_bytes=128 * 1024 * 1024)
    assert not r.ok and "memory" in r.text.lower()


def test_math_tool_action_parsing():
    assert parse_action("answer 42") == ("answer", "42")
    assert parse_action("answer: -7") == ("answer", "-7")
    assert parse_action("calc 3*4") == ("call", "3*4")
    assert parse_action("3 * (4+1)") == ("call", "3 * (4+1)")
    assert parse_action("hello there!")[0] == "invalid"


async def test_math_tool_episode_tool_call_then_answer():
    env = make_env("math_tool", terms=[2])
    reset = await env.reset(3)
    expr = reset.observation.removeprefix("compute ")
    step = await env.step(f"calc {expr}")
    assert not step.done and step.observation.startswith("result ")
    value = step.observation.removeprefix("result ")
    final = await env.step(f"answer {value}")
    assert final.done and final.reward == 1.0 and final.info["success"]
    await env.reset(3)
    wrong = await env.step("answer 123456789")
    assert wrong.done and wrong.reward == 0.0


async def test_math_tool_truncates_after_tool_budget():
    env = make_env("math_tool", max_tool_calls=2, tool_penalty=0.1)
    await env.reset(0)
    steps = [await env.step("calc 1+1"), await env.step("nonsense!"), await env.step("calc 2")]
    assert [s.done for s in steps] == [False, False, True] and steps[-1].truncated
    assert all(s.reward == pytest.approx(-0.1) for s in steps)
    assert steps[1].observation.startswith("Reply with calc")


# ---- tic-tac-toe -------------------------------------------------------------------------------------

async def test_tictactoe_alternates_agents_and_scores_both_sides():
    env = make_env("tictactoe", random_start=False)
    reset = await env.reset(0)
    assert reset.agent == 0 and "you are X" in reset.observation
    moves = ["1", "4", "2", "5"]
    for i, m in enumerate(moves):
        s = await env.step(m)
        assert not s.done and s.agent == (i + 1) % 2
        assert f"you are {'XO'[s.agent]}" in s.observation
    win = await env.step("3")  # X completes the top row
    assert win.done and win.rewards == {0: 1.0, 1: -1.0}


async def test_tictactoe_illegal_move_loses_and_draw_is_zero():
    env = make_env("tictactoe", random_start=False)
    await env.reset(0)
    await env.step("5")
    s = await env.step("5")  # O takes a taken cell
    assert s.done and s.rewards == {1: -1.0, 0: 0.0} and s.info["illegal"]
    await env.reset(0)
    for m in "12354687":
        s = await env.step(m)
        assert not s.done
    s = await env.step("9")
    assert s.done and s.rewards == {0: 0.0, 1: 0.0}


async def test_tictactoe_seed_chooses_first_player():
    env = make_env("tictactoe")
    assert {(await env.reset(seed)).agent for seed in range(20)} == {0, 1}


# ---- registry ----------------------------------------------------------------------------------------

def test_builtin_envs_registered():
    assert {"follow_signs", "goal_walk", "sokoban", "math_tool", "tictactoe", "http"} <= set(known_envs())


def test_entry_point_environment_from_a_user_package(tmp_path, monkeypatch):
    """A package installed with an entry point in group turnstream.environments is found by name."""
    (tmp_path / "my_user_envs.py").write_text(textwrap.dedent('''
        from turnstream.actors.environment import Environment, Reset, Step

        class Echo(Environment):
            def __init__(self, word="hi"):
                self.word = word
            async def reset(self, seed):
                return Reset(self.word, "echo")
            async def step(self, action):
                return Step("", 1.0, True)
    '''))
    dist = tmp_path / "my_user_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-user-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[turnstream.environments]\necho_plugin = my_user_envs:Echo\nbroken_plugin = my_user_envs:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "echo_plugin" in known_envs()
    env = make_env("echo_plugin", word="yo")
    assert env.word == "yo"
    with pytest.raises(KeyError, match="broken_plugin"):
        make_env("broken_plugin")
    sys.modules.pop("my_user_envs", None)
