"""The metric catalogue matches the code, every metric follows the naming rules, and the lint catches breaks."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from turnstream.core import build_info
from turnstream.reference.metrics import (DOC_PATH, KNOWN_DEVIATIONS, ROLES, catalogue, lint_catalogue,
                                          lint_exposition, lint_metric, names_by_role, render_markdown)


def test_docs_metrics_md_is_up_to_date():
    assert DOC_PATH.exists(), "run: python -m turnstream.reference.metrics --write"
    assert DOC_PATH.read_text() == render_markdown(), (
        "docs/metrics.md differs from the metric classes; run: python -m turnstream.reference.metrics --write")


def test_every_role_has_metrics_and_names_are_unique():
    specs = catalogue()
    assert {s.role for s in specs} == {"all", *ROLES}
    names = [s.name for s in specs]
    assert len(names) == len(set(names)), "a metric name is used by two roles or twice"
    assert all(s.name.startswith(f"turnstream_{s.role}_") for s in specs if s.role != "all")


def test_every_metric_follows_the_naming_rules():
    problems = {k: v for k, v in lint_catalogue().items() if k not in KNOWN_DEVIATIONS}
    assert problems == {}


def test_known_deviations_still_exist():
    # when a deviation is fixed in its owner's code, its entry (and the exception it grants) must go
    current = lint_catalogue()
    assert set(KNOWN_DEVIATIONS) <= set(current), set(KNOWN_DEVIATIONS) - set(current)


@pytest.mark.parametrize("name, kind, labels, expected", [
    ("turnstream_learner_steps_total", "counter", (), None),
    ("turnstream_learner_steps", "counter", (), "_total"),
    ("turnstream_buffer_depth_total", "gauge", (), "reserved for counters"),
    ("learner_steps_total", "counter", (), "prefix"),
    ("turnstream_Learner_steps_total", "counter", (), "snake_case"),
    ("turnstream_learner_push_ms", "histogram", (), "non-base"),
    ("turnstream_learner_push_s", "gauge", (), "non-base"),
    ("turnstream_learner_push_duration", "gauge", (), "seconds"),
    ("turnstream_learner_push", "histogram", (), "does not end in a unit"),
    ("turnstream_buffer_memory_mib", "gauge", (), "non-base"),
    ("turnstream_actor_episodes_total", "counter", ("episode_id",), "unbounded"),
    ("turnstream_actor_episodes_total", "counter", ("prompt_key",), "unbounded"),
    ("turnstream_actor_episodes_total", "counter", ("le",), "reserved"),
    ("turnstream_actor_episodes_total", "counter", ("Outcome",), "snake_case"),
    ("turnstream_actor_episodes_by_outcome_total", "counter", ("outcome",), "repeated"),
])
def test_lint_rules(name, kind, labels, expected):
    problems = lint_metric(name, kind, labels)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in p for p in problems), problems


def test_lint_exposition_flags_unknown_families_and_unbounded_values():
    r = CollectorRegistry()
    build_info.register_build_info(r, "buffer")
    Counter("turnstream_buffer_surprise_total", "not catalogued", registry=r).inc()
    g = Gauge("turnstream_buffer_ready_episodes", "known", ["episode"], registry=r)
    g.labels("0123456789abcdef0123").set(1)
    problems = lint_exposition(generate_latest(r).decode(), role="buffer")
    assert "turnstream_build_info" not in problems
    assert any("not in the buffer catalogue" in p for p in problems["turnstream_buffer_surprise_total"])
    assert any("unbounded" in p for p in problems["turnstream_buffer_ready_episodes"])


def test_a_role_registry_exposition_lints_clean():
    from turnstream.buffer.metrics import BufferMetrics

    m = BufferMetrics(CollectorRegistry())
    m.counts.chunks["ok"] += 1
    m.served_staleness.observe(1)
    assert lint_exposition(generate_latest(m.registry).decode(), role="buffer") == {}


def test_names_by_role_include_build_info():
    names = names_by_role()
    assert all(build_info.NAME in names[role] for role in ROLES)
    assert "turnstream_learner_steps" in names["learner"]  # counters as the text parser names them


def test_build_info_gauge():
    r = CollectorRegistry()
    build_info.register_build_info(r, "learner")
    text = generate_latest(r).decode()
    assert 'turnstream_build_info{' in text and 'role="learner"' in text and text.rstrip().endswith("1.0")
    with pytest.raises(ValueError):
        build_info.register_build_info(CollectorRegistry(), "trainer")


def test_roles_with_build_info_include_the_launcher():
    from tests.catalogue_queries import roles_with_build_info

    assert "launcher" in roles_with_build_info() <= set(ROLES)
