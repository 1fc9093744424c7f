"""`turnstream bench envs`: which phases it plays, and how it reads them against the targets (no servers here; the
bench itself starts vLLM, a buffer and an actor per phase)."""
from __future__ import annotations

import pytest

from benchmarks.envs import ENVIRONMENTS, PhaseResult, format_table, main, phases, summary
from turnstream.core.configtools import ConfigError
from turnstream.actors.envs.registry import make_env


def test_every_probe_the_bench_plays_is_registered_with_its_args():
    for name, fault in ENVIRONMENTS.values():
        make_env(name, turns=2, max_action_tokens=4, **fault)


def test_each_isolation_plays_the_well_behaved_env_before_and_after_the_others():
    names = [p.name for p in phases(list(ENVIRONMENTS))]
    loop, process = names[:names.index("well/process")], names[names.index("well/process"):]
    assert loop[0] == loop[-1] == "well/loop" and process[0] == process[-1] == "well/process"
    for env in ENVIRONMENTS:
        assert f"{env}/loop" in loop and f"{env}/process" in process
    assert "slow_tool/loop/fixed-k" in loop


def _result(name: str, tokens: float | None, died: bool = False, round_: int = 0) -> PhaseResult:
    return PhaseResult(name, actor_died=died, round=round_, tokens_per_s=tokens,
                       turns_per_s=None if tokens is None else tokens / 16)


def test_ratios_are_against_the_mean_well_behaved_phase_of_the_same_isolation():
    results = [_result("well/loop", 1000), _result("well/process", 900), _result("block/loop", 200),
               _result("block/process", 810), _result("crash/loop", None, died=True), _result("crash/process", 700),
               _result("slow_tool/loop", 950), _result("well/loop", 1200), _result("well/process", 900)]
    out = summary(results)
    assert out["ratios"]["block/process"] == 0.9 and out["ratios"]["slow_tool/loop"] == round(950 / 1100, 3)
    assert out["ratios"]["crash/loop"] is None
    assert out["actor_died"] == ["crash/loop"] and out["targets"]["no_actor_death"]["died"] == []
    assert out["targets_met"]
    assert "crash/loop" in format_table(results, out["ratios"])


def test_a_ratio_is_the_median_over_rounds_of_each_rounds_own_ratio():
    rounds = [[_result("well/loop", w, round_=i), _result("slow_tool/loop", x, round_=i)]
              for i, (w, x) in enumerate([(1000, 900), (500, 500), (1000, 700)])]
    out = summary([r for one in rounds for r in one])
    assert out["ratios_per_round"]["slow_tool/loop"] == [0.9, 1.0, 0.7] and out["ratios"]["slow_tool/loop"] == 0.9


def test_a_target_missed_or_an_actor_death_elsewhere_fails_the_run():
    base = [_result("well/loop", 1000), _result("well/process", 1000), _result("slow_tool/loop", 900)]
    assert not summary([*base, _result("block/process", 700)])["targets_met"]
    dead = summary([*base, _result("block/process", 900), _result("hang/process", None, died=True)])
    assert dead["targets"]["no_actor_death"]["died"] == ["hang/process"] and not dead["targets_met"]


def test_an_unknown_environment_is_named():
    with pytest.raises(ConfigError, match="unknown nope"):
        main(["--envs", "well,nope"])
