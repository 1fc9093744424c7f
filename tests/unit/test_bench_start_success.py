"""`turnstream bench start-success` measures a warm-started model on the tasks its build recorded."""
from __future__ import annotations

import json

from benchmarks.start_success import warm_started_tasks
from turnstream.warm_start.build import MODEL_INFO


def test_the_tasks_come_from_the_models_record(tmp_path):
    task = {"env": "follow_signs", "args": {"length": 3}, "context_turns": 0, "mistakes": 0.2}
    (tmp_path / MODEL_INFO).write_text(json.dumps({"seed": 0, "warm_start": {"tasks": [task]}}))
    assert warm_started_tasks(tmp_path) == {"follow_signs": task}


def test_a_model_without_a_warm_start_has_no_tasks(tmp_path):
    assert warm_started_tasks(tmp_path) == {}
    (tmp_path / MODEL_INFO).write_text(json.dumps({"seed": 0}))  # built by make_tiny_model alone
    assert warm_started_tasks(tmp_path) == {}
