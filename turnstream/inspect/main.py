"""`turnstream inspect RUN_DIR [--step N] [--episode ID] [--html OUT_DIR]`: what a recorded run's learner steps
trained on (learner.record = true; learner/record/).

Without --step: a line per step of the run's lineage. With it: each step's episodes (prompt key, return, turns,
staleness per token, the importance weight and the advantage per turn), the step's figures from learner.jsonl, and
each --episode token by token. The learner's log-probs and the advantages of an estimator that reads the learner's
state come from the learner rebuilt as it was before the step (turnstream/replay/rebuild.py, retraining the recorded
steps from the nearest checkpoint below): bit for bit the run's own on the CPU. --no-learner skips that.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from turnstream.core.configtools import ConfigError
from turnstream.inspect.learner_view import LearnerView, empty_view, view_with_trainer, view_without_trainer
from turnstream.inspect.step_page import StepPage, step_page
from turnstream.inspect.text import episode_lines, record_lines, step_lines
from turnstream.inspect.tokens import token_text
from turnstream.learner.record.reader import RecordedStep, RecordError, open_record
from turnstream.reports.run_log import steps_by_version

log = logging.getLogger("turnstream.inspect")


def learner_view(step: RecordedStep, walk, cfg) -> tuple[LearnerView, str]:
    """The step's learner numbers, and a phrase saying where they come from."""
    if walk is None:
        return view_without_trainer(cfg.learner, cfg.model.path, step.batch), "not rebuilt (--no-learner)"
    try:
        trainer = walk.at(step.learner_version)
    except RecordError as exc:
        return view_without_trainer(cfg.learner, cfg.model.path, step.batch), f"not rebuilt: {exc}"
    return view_with_trainer(trainer, step.batch), f"rebuilt at version {step.learner_version} from the record"


def pages(run_dir: Path, versions: list[int], learner: bool, overrides: list[str]) -> list[StepPage]:
    from turnstream.inspect.walk import LearnerWalk

    record = open_record(run_dir)
    figures = steps_by_version(run_dir)
    walk = LearnerWalk(run_dir, overrides) if learner else None
    out = []
    for version in sorted(set(versions)):
        step = record.step(version)
        cfg = (walk.config_at(step.learner_version) if walk else record.incarnations[-1].config(overrides))
        if step.lost:
            log.warning("step %d is lost: the learner took it but could not record it", version)
            continue
        view, source = learner_view(step, walk, cfg) if step.batch.episode_ids else (empty_view(step.batch, ""), "")
        out.append(step_page(step, view, figures.get(version, {}), source))
    return out


def main(run_dir: str, *, steps: list[int] | None, episodes: list[str], html: str | None, learner: bool,
         overrides: list[str]) -> int:
    run = Path(run_dir)
    record = open_record(run)
    if not steps and not html:
        if episodes:
            raise ConfigError("inspect --episode: name the step that trained it (--step N)")
        print("\n".join(record_lines(record, steps_by_version(run))))
        return 0
    versions = steps or [v for v in record.versions if v not in record.lost()]
    shown = pages(run, versions, learner, overrides)
    text = token_text(record.incarnations[-1].config(overrides).model.path)
    if steps:
        for page in shown:
            print("\n".join(step_lines(page)))
            for row in page.episodes:
                if row.item.episode_id in episodes:
                    print("\n".join(episode_lines(page, row, text)))
        found = {row.item.episode_id for page in shown for row in page.episodes}
        for missing in [e for e in episodes if e not in found]:
            print(f"inspect: no episode {missing!r} in step(s) {', '.join(map(str, steps))}", file=sys.stderr)
    if html:
        from turnstream.inspect.html import write_pages

        print(f"wrote {write_pages(Path(html), shown, text)}")
    return 0
