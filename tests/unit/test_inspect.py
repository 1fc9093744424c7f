"""`turnstream inspect` and the offline half of `turnstream regenerate` on recorded runs (no vLLM): a batch read back
as the requests its turns were, a step's episodes with the learner's own numbers, the HTML pages, and what
regenerate says of turns it cannot sample again. Against a real server: tests/e2e/test_regenerate_vllm.py."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.learner_batches import synthetic_batch
from tests.unit.test_replay import _run as recorded_run
from tests.unit.test_store import chunk
from turnstream.buffer.store.episodes import Episode, Segment, flatten
from turnstream.cli import main as cli_main
from turnstream.core.config import Config
from turnstream.inspect.episodes import items
from turnstream.inspect.main import pages
from turnstream.inspect.regenerate import main as regenerate_main
from turnstream.inspect.weights import kept_weights
from turnstream.learner.record.reader import open_record
from turnstream.learner.record.writer import StepRecorder


def _episode(turns: list) -> Episode:
    ep = Episode(turns[0].episode_id, ("a0", 0), turns[0].prompt_key)
    for c in turns:
        ep.add(c)
    return ep


def test_a_served_batch_reads_back_as_the_requests_its_turns_were():
    """Each trained turn's context is what the actor gave vLLM: the episode so far, from its last context restart;
    a segment's context turns are not its turns, and its bootstrap turn holds its first token only."""
    a = [chunk(seq=0, ep="a", turn=0, obs=(1, 2), gen=(3, 4), reward=0.5),
         dataclasses.replace(chunk(seq=1, ep="a", turn=1, obs=(5,), gen=(6,)), seed=41, top_p=0.9, top_k=7),
         dataclasses.replace(chunk(seq=2, ep="a", turn=2, obs=(7, 8), gen=(9,), done=True, reward=1.0),
                             context_reset=True, seed=42)]
    b = [chunk(seq=3, ep="b", turn=t, obs=(10 + t,), gen=(20 + t, 30 + t), versions=t) for t in range(3)]
    batch = flatten([_episode(a), Segment(_episode(b), first=1, end=2, ready_at=0.0)], request_id=1,
                    learner_version=2, dropped_stale=0)
    first, second = items(batch)
    assert [t.turn for t in first.turns] == [0, 1, 2] and first.rewards.tolist() == [0.5, 0.0, 1.0]
    assert [t.context.tolist() for t in first.turns] == [[1, 2], [1, 2, 3, 4, 5], [7, 8]]
    assert [(t.seed, t.top_p, t.top_k) for t in first.turns] == [(-1, 1.0, 0), (41, pytest.approx(0.9), 7),
                                                                 (42, 1.0, 0)]
    assert first.turns[1].tokens.tolist() == [6] and first.turns[2].observation.tolist() == [7, 8]
    assert (second.first_turn, second.bootstrap_turn) == (1, 2)
    assert [t.turn for t in second.turns] == [1, 2]  # turn 0 is context
    assert second.turns[0].context.tolist() == [10, 20, 30, 11] and second.turns[0].versions.tolist() == [1, 1]
    assert not second.turns[1].complete and second.turns[1].tokens.tolist() == [22]


@pytest.fixture(scope="module")
def spo_run(tmp_path_factory) -> Config:
    """A recorded spo run with a learner restart in it (tests/unit/test_replay.py), shared by the tests below."""
    return recorded_run(tmp_path_factory.mktemp("spo"))


def _page_lines(capsys, *argv) -> list[str]:
    assert cli_main(["inspect", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_inspect_shows_a_step_with_the_learners_own_numbers(spo_run, capsys):
    cfg = spo_run
    listing = _page_lines(capsys, str(cfg.run_dir))
    assert "7 recorded steps" in listing[0] and "superseded: [5]" in listing[0]
    assert [line.split()[0] for line in listing[2:]] == [str(v) for v in range(1, 8)]

    lines = _page_lines(capsys, str(cfg.run_dir), "--step", "6", "--episode", "e1")
    assert lines[0].startswith("step 6: trained at version 5") and "rebuilt at version 5" in lines[2]
    table = [line.split() for line in lines[4:16]]
    assert [row[1] for row in table] == [f"e{i}" for i in range(12)]
    token_rows = [line.split() for line in lines[17:]
                  if line.startswith("    ") and line.split()[0] not in ("observation:", "token")]
    assert lines[16].startswith("episode e1 in step 6") and all("-" not in row[-3:] for row in token_rows)
    # the importance weights are the step's own (pi_prox before its updates): the largest is the one it logged
    (page,) = pages(cfg.run_dir, [6], True, [])
    weights = np.concatenate([row.importance_weights() for row in page.episodes])
    assert weights.max() == pytest.approx(page.figures["is_weight_max"], rel=1e-5)

    bare = _page_lines(capsys, str(cfg.run_dir), "--step", "6", "--no-learner")
    assert "not rebuilt (--no-learner)" in bare[2] and "no advantages: the spo estimator" in bare[2]


def test_estimators_without_learner_state_show_advantages_without_the_learner(tmp_path, capsys):
    cfg = recorded_run(tmp_path, estimator="grpo")
    lines = _page_lines(capsys, str(cfg.run_dir), "--step", "2", "--no-learner")
    advantages = [float(x) for line in lines[4:16] for x in line.split()[8:]]
    assert advantages and any(a != 0 for a in advantages)


def test_without_the_learner_episodes_over_the_budget_it_would_choose_are_dropped(tiny_model, llm_sized_model):
    """learner.max_tokens_per_microbatch = "auto" read as the learner resolves it, from the checkpoint's size."""
    from turnstream.core.config import LearnerSection
    from turnstream.inspect.learner_view import view_without_trainer

    batch = synthetic_batch(6, vocab=64, turns=(2, 500), seed=1, group=2)
    lengths = dict(zip(batch.episode_ids, np.diff(batch.episode_offsets)))
    over = {e for e, n in lengths.items() if n > 2048}
    assert 0 < len(over) < len(lengths)
    cfg = LearnerSection(estimator="grpo")
    assert set(view_without_trainer(cfg, str(llm_sized_model), batch).dropped) == over
    assert view_without_trainer(cfg, str(tiny_model), batch).dropped == ()  # no budget for the tiny model


def test_html_pages_colour_tokens_by_advantage(spo_run, tmp_path):
    cfg = spo_run
    out = tmp_path / "html"
    assert cli_main(["inspect", str(cfg.run_dir), "--step", "2", "--step", "3", "--html", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "step-000002.html", "step-000003.html"]
    page = (out / "step-000003.html").read_text()
    assert 'href="step-000002.html"' in page and 'id="e11"' in page
    assert "rgba(0,150,60," in page and "rgba(210,30,30," in page and "importance weight" in page


def _seeded_record(tmp_path, versions) -> Config:
    """A record of one step whose episodes' tokens came from `versions` (per generated token), every turn seeded."""
    batch = synthetic_batch(2, turns=(2,), gen_len=(3,), seed=1, learner_version=1)
    batch = dataclasses.replace(batch, versions=np.where(batch.versions >= 0, 0, -1).astype(np.int32),
                                turn_seeds=np.arange(len(batch.turn_rewards), dtype=np.int64) + 100)
    first_gen = np.flatnonzero(batch.action_mask)[:3]  # e0's turn 0: a push landed after its first token
    batch.versions[first_gen] = versions
    cfg = Config()
    cfg.run.run_dir, cfg.model.path = str(tmp_path / "run"), str(tmp_path / "nowhere")
    StepRecorder.start(cfg, 1, 1, None).write_step(2, batch, b"", 0.0)
    return cfg


def test_regenerate_names_turns_it_cannot_sample_again(tmp_path, capsys):
    cfg = _seeded_record(tmp_path, [0, 1, 1])
    code = regenerate_main(str(cfg.run_dir), "e0", None, None, False, [])
    out = capsys.readouterr().out.splitlines()
    assert code == 3  # no turn was sampled again: nothing was compared, which is no success
    assert out[-2] == "nothing compared: no turn of episode e0 could be sampled again; exit status 3"
    assert "version 0, seed 100, 1 tokens of 3 (a push landed mid-turn; the rest came from versions [1])" in out[1]
    assert out[1].endswith("not regenerated: the weights of version 0 are not kept")
    summary = json.loads(out[-1])
    assert (summary["turns"], summary["no_weights"], summary["equal"], summary["versions"]) == (2, 2, 0, [0])
    assert summary["compared"] == 0


def test_the_weights_a_run_keeps_are_found(tmp_path):
    cfg = _seeded_record(tmp_path, [0, 0, 0])
    run = cfg.run_dir
    assert kept_weights(cfg, run, 0) is None and kept_weights(cfg, run, 3) is None
    for directory in (run / "weights" / "v000003", run / "checkpoints" / "step-000004" / "model"):
        directory.mkdir(parents=True)
        (directory / "config.json").write_text("{}")
        (directory / "model.safetensors").write_bytes(b"")
    assert kept_weights(cfg, run, 3).source == "pushed weights"
    assert kept_weights(cfg, run, 4).source == "checkpoint"
    assert open_record(run).step(2).batch.turn_seeds.size == 4


def test_a_run_without_a_record_or_the_step_asked_for_is_one_line(spo_run, tmp_path, capsys):
    assert cli_main(["inspect", str(tmp_path)]) == 2
    assert "holds no learner record" in capsys.readouterr().err
    assert cli_main(["inspect", str(spo_run.run_dir), "--step", "99"]) == 2
    assert "holds no step 99" in capsys.readouterr().err
