"""`turnstream bench async` bookkeeping: medians with a cap, speedups, the table, records, the grid flags."""
from __future__ import annotations

import json

import pytest

from benchmarks import async_vs_sync
from benchmarks.async_grid import RunRecord, format_table, headline, median_with_cap, settings, speedups


def _rec(env="follow_signs", eta=0, seed=0, secs: float | None = 50.0, cap=100.0, **kw) -> RunRecord:
    base = dict(env=env, eta=eta, seed=seed, target=0.6, cap_s=cap, seconds_to_target=secs, wall_s=secs or cap,
                final_success=0.7, episodes=1000, tokens=50_000, episodes_played=1100.0, tokens_generated=4000.0,
                learner_busy=0.4, push_busy=0.05, learner_wait=0.5, generation_busy=0.6, window_s=40.0,
                staleness={"0": 30, "1": 70}, push_s_mean=0.1, steps=10, first_step_s=8.0,
                curve=[[10.0, 0.2], [20.0, 0.6]])
    base.update(kw)
    return RunRecord(**base)


def test_median_with_cap_counts_unreached_runs_as_the_cap():
    assert median_with_cap([_rec(secs=30), _rec(secs=50), _rec(secs=None)]) == (50.0, False)  # exact
    assert median_with_cap([_rec(secs=30), _rec(secs=None), _rec(secs=None)]) == (100.0, True)  # a bound
    assert median_with_cap([_rec(secs=None)]) == (100.0, True)
    assert median_with_cap([_rec(secs=20)]) == (20.0, False)
    # even count: the two middle values are averaged, exact only while both are real
    assert median_with_cap([_rec(secs=10), _rec(secs=20), _rec(secs=40), _rec(secs=None)]) == (30.0, False)
    assert median_with_cap([_rec(secs=10), _rec(secs=20), _rec(secs=None), _rec(secs=None)]) == (60.0, True)


def test_settings_aggregate_per_env_and_eta():
    recs = [_rec(eta=2, seed=s, secs=t) for s, t in enumerate((40, 30, 35))] + [_rec(eta=0, secs=90)]
    rows = settings(recs)
    assert [(s.env, s.eta) for s in rows] == [("follow_signs", 0), ("follow_signs", 2)]  # etas ascending
    eta2 = rows[1]
    assert (eta2.runs, eta2.reached, eta2.median_s, eta2.median_is_bound) == (3, 3, 35, False)
    assert eta2.staleness == {0: 90, 1: 210} and eta2.staleness_mean == pytest.approx(0.7)


def test_speedup_is_sync_over_the_best_async_median():
    recs = ([_rec(eta=0, seed=s, secs=t) for s, t in enumerate((100, 90, 80))]
            + [_rec(eta=1, seed=s, secs=t) for s, t in enumerate((60, 50, 70))]
            + [_rec(eta=4, seed=s, secs=t) for s, t in enumerate((45, 45, 99))]
            + [_rec(env="follow_signs_longtail", eta=e, secs=t) for e, t in ((0, 80), (2, 40))])
    out = speedups(settings(recs))
    assert out["follow_signs"] == {"sync_s": 90, "async_s": 45, "best_eta": 4, "speedup": 2.0, "kind": "exact"}
    assert out["follow_signs_longtail"]["speedup"] == 2.0
    line = headline(settings(recs), target=0.6, cap_s=100.0)
    assert (line["speedup"], line["sync_s"], line["async_s"], line["env"]) == (2.0, 90, 45, "follow_signs")
    assert set(line["per_env"]) == {"follow_signs", "follow_signs_longtail"}
    json.dumps(line)  # one JSON line


def test_speedup_kind_says_which_median_was_capped():
    def kind(sync_secs, async_secs):
        recs = [_rec(eta=0, secs=sync_secs), _rec(eta=2, secs=async_secs)]
        return speedups(settings(recs))["follow_signs"]

    assert kind(None, 50)["kind"] == "lower_bound" and kind(None, 50)["speedup"] == 2.0  # sync >= cap
    assert kind(50, None)["kind"] == "upper_bound"
    assert kind(None, None)["kind"] == "unknown"
    # a tie goes to the smaller eta
    recs = [_rec(eta=0, secs=80), _rec(eta=4, secs=40), _rec(eta=2, secs=40)]
    assert speedups(settings(recs))["follow_signs"]["best_eta"] == 2
    # without a sync or an async setting there is nothing to compare
    assert speedups(settings([_rec(eta=0)])) == {} and headline([], 0.6, 100.0)["speedup"] is None


def test_table_marks_bounds_and_shows_every_column():
    rows = settings([_rec(eta=0, secs=None), _rec(eta=2, secs=42.25, staleness={"0": 1, "2": 3})])
    text = format_table(rows)
    lines = text.splitlines()
    assert "to target s" in lines[0] and "staleness" in lines[0]
    assert ">=100.0" in lines[2] and "0/1" in lines[2]
    assert "42.2" in lines[3] and "1/1" in lines[3] and "0:25% 2:75%" in lines[3]
    assert "0.60" in lines[3] and "0.40" in lines[3]  # generation and learner busy


def test_records_round_trip_and_the_grid_flags():
    r = _rec(secs=None)
    assert RunRecord.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert not r.reached and r.seconds_or_cap() == 100.0
    args = async_vs_sync.parse_args(["--envs", "follow_signs", "--etas", "0,2", "--seeds", "0"])
    assert async_vs_sync.grid(args) == [("follow_signs", 0, 0), ("follow_signs", 2, 0)]
    full = async_vs_sync.grid(async_vs_sync.parse_args([]))
    assert len(full) == 2 * 5 * 3 and full[0] == ("follow_signs", 0, 0)
    with pytest.raises(SystemExit):
        async_vs_sync.grid(async_vs_sync.parse_args(["--envs", "nope"]))


def test_run_config_is_the_same_but_for_eta():
    args = async_vs_sync.parse_args(["--batch", "32"])
    a = async_vs_sync.run_config("follow_signs_longtail", 0, 1, "http://h:1", args)
    b = async_vs_sync.run_config("follow_signs_longtail", 4, 1, "http://h:1", args)
    assert (a.buffer.eta, b.buffer.eta, b.buffer.max_staleness) == (0, 4, 6)
    assert a.env.name == "follow_signs_longtail" and a.buffer.batch_episodes == 32
    a.buffer.eta = b.buffer.eta = 0
    a.buffer.max_staleness = b.buffer.max_staleness = 0
    a.run.run_dir = b.run.run_dir = ""
    assert a == b


def test_record_uses_counter_deltas_over_the_window():
    snap = async_vs_sync.Snapshot
    keys = async_vs_sync.COUNTERS
    first = snap(10.0, {**dict.fromkeys(keys, 0.0), "gen_busy_s": 2.0, "step_s": 1.0, "wait_s": 3.0})
    last = snap(30.0, {**dict.fromkeys(keys, 0.0), "gen_busy_s": 17.0, "step_s": 9.0, "push_s": 1.0, "wait_s": 13.0,
                       "episodes_played": 500.0, "tokens_generated": 1500.0})
    steps = [{"episodes": 64, "tokens": 3000, "return_mean": r, "time": 1000.0 + 5 * i, "push_s": p,
              "staleness_hist": {"0": 10, "1": 5}} for i, (r, p) in enumerate(((0.2, 0.1), (0.5, float("nan"))))]
    args = async_vs_sync.parse_args([])
    r = async_vs_sync.record("follow_signs", 1, 0, args, steps, 12.5, 40.0, first, last, t0=995.0,
                             rolling=lambda s: sum(x["return_mean"] for x in s) / len(s))
    assert r.generation_busy == 15.0 / 20.0 and r.learner_busy == 8.0 / 20.0 and r.push_busy == 1.0 / 20.0
    assert r.learner_wait == 10.0 / 20.0
    assert (r.episodes, r.tokens, r.episodes_played, r.steps) == (128, 6000, 500.0, 2)
    assert r.staleness == {"0": 20, "1": 10} and r.push_s_mean == 0.1  # a failed (NaN) push is left out
    assert r.curve == [[5.0, 0.2], [10.0, 0.35]] and r.first_step_s == 5.0
    never = async_vs_sync.record("follow_signs", 1, 0, args, [], None, 90.0, None, None, t0=0.0, rolling=len)
    assert never.generation_busy == 0.0 and never.final_success == 0.0 and not never.reached


def test_async_report_plots_the_bench_output_next_to_the_records(tmp_path, capsys):
    from benchmarks import async_report

    recs = [_rec(eta=e, seed=s, secs=None if e == 0 and s == 1 else 20.0 + e,
                 curve=[[5.0 + s, 0.1], [12.0 + e, 0.4], [20.0 + e, 0.65]])
            for e in (0, 2) for s in (0, 1)]
    recs.append(_rec(env="follow_signs_longtail", eta=0, curve=[]))  # a run that never trained
    (tmp_path / async_report.RECORDS).write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs))
    assert async_report.main([str(tmp_path)]) == 0
    png = tmp_path / async_report.PLOT
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["eta"] for r in async_report.read_records(tmp_path)] == [0, 0, 2, 2, 0]


def test_async_report_without_records_says_so(tmp_path, capsys):
    from benchmarks import async_report

    assert async_report.main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip() == f"bench async-report: {tmp_path} has no records.jsonl"


def test_median_curve_holds_finished_runs_and_skips_times_before_any_start():
    from benchmarks.async_report import median_curve, value_at

    a, b, c = [[1.0, 0.2], [3.0, 0.6]], [[2.0, 0.4], [6.0, 0.8]], [[2.0, 0.0], [4.0, 0.1]]
    assert value_at(a, 0.5) is None and value_at(a, 2.9) == 0.2 and value_at(a, 10.0) == 0.6
    xs, ys = median_curve([a, b, c], points=6)  # grid 0, 1, ..., 6
    assert xs == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert ys == [0.2, 0.2, 0.4, 0.4, 0.4, 0.6]  # at 6: a held at 0.6, b 0.8, c held at 0.1


def test_progress_line_names_the_run():
    from turnstream.reports.progress import Progress

    p = Progress(128, label="follow_signs eta=2 seed=0")
    assert p.line([], 3.0) == "follow_signs eta=2 seed=0: waiting for the first learner step (3s)"


def test_the_estimator_is_one_setting_for_every_run():
    from turnstream.core.config import ConfigError

    args = async_vs_sync.parse_args(["--estimator", "turn_gae"])
    assert {async_vs_sync.run_config(env, eta, 0, "http://h:1", args).learner.estimator
            for env in async_vs_sync.ENVS for eta in (0, 4)} == {"turn_gae"}
    assert async_vs_sync.run_config("follow_signs", 0, 0, "http://h:1", async_vs_sync.parse_args([])).learner.estimator \
        == "spo"  # the built-in default
    with pytest.raises(ConfigError, match="^learner.estimator"):
        async_vs_sync.parse_args(["--estimator", "nope"])


def test_a_run_config_file_is_the_base_of_every_run_and_flags_still_win():
    args = async_vs_sync.parse_args(["--config", "configs/smollm2_arithmetic.toml", "--etas", "0,1", "--seeds", "3",
                                     "--pin"])
    assert async_vs_sync.grid(args) == [("arithmetic", 0, 3), ("arithmetic", 1, 3)]
    cfg = async_vs_sync.run_config("arithmetic", 1, 3, "http://h:1", args)
    assert (cfg.model.path, cfg.env.name, cfg.env.args["digits"]) == ("runs/smollm2-135m", "arithmetic", 1)
    assert (cfg.buffer.batch_episodes, cfg.actor.max_new_tokens, cfg.learner.lr) == (32, 24, "auto")
    assert (cfg.buffer.eta, cfg.buffer.max_staleness, cfg.run.seed, cfg.vllm.urls) == (1, 3, 3, ["http://h:1"])
    assert (cfg.learner.cpus, cfg.learner.torch_threads, cfg.actor.cpus) == ([1], 1, [0])
    assert cfg.vllm.max_model_len == 1024 and cfg.vllm.max_num_seqs == 64  # the file's server settings
    flagged = async_vs_sync.parse_args(["--config", "configs/smollm2_arithmetic.toml", "--lr", "3e-5", "--batch", "16"])
    cfg = async_vs_sync.run_config("arithmetic", 0, 0, "http://h:1", flagged)
    assert (cfg.learner.lr, cfg.buffer.batch_episodes) == (3e-5, 16)


def test_a_config_names_its_environment_and_a_bad_one_is_one_line(tmp_path, capsys):
    from turnstream.core.config import ConfigError

    with pytest.raises(SystemExit):
        async_vs_sync.parse_args(["--config", "configs/smollm2_arithmetic.toml", "--envs", "follow_signs"])
    assert "--envs and --config" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[buffer]\neta = -1\n")
    with pytest.raises(ConfigError, match="^buffer.eta"):
        async_vs_sync.parse_args(["--config", str(bad)])
