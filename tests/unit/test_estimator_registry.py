"""The estimator is a seam (docs/estimators.md, "Add an estimator"): one class per estimator behind one interface,
chosen once from `learner.estimator` by the registry, and nothing outside learner/estimators/ tells estimators
apart by name. A new estimator is its class and its registration: the Trainer runs it unchanged."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import torch

ROOT = Path(__file__).resolve().parents[2]
OWN = ROOT / "learner" / "estimators"
# the product's folders above the config (core validates `learner.estimator` by its values: it sits below the
# learner and cannot see the registry, so it is left out)
SCANNED = ("learner", "turnstream", "buffer", "actors", "protocol")


def _names_estimator(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "estimator") or (
        isinstance(node, ast.Attribute) and node.attr == "estimator")


def name_comparisons(path: Path) -> list[str]:
    """file:line of each comparison (==, !=, in, not in) of a value named `estimator` (a variable or an
    attribute, e.g. cfg.estimator) with anything."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(_names_estimator(side) for side in (node.left, *node.comparators)):
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno}")
    return found


def test_no_module_outside_the_estimators_compares_the_estimators_name():
    found = [hit for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py"))
             if not path.is_relative_to(OWN) for hit in name_comparisons(path)]
    assert found == []


def test_the_checker_sees_a_name_comparison(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(cfg, estimator):\n    return cfg.estimator == "spo" or estimator in ("grpo",)\n'
                     'def g(estimator):\n    return estimator.needs_critic\n')
    assert name_comparisons(probe) == ["probe.py:2", "probe.py:2"]


def test_the_registry_holds_exactly_the_names_the_config_allows():
    from turnstream.core.config_learner import CRITIC_ESTIMATORS, LearnerSection
    from turnstream.learner.estimators.registry import ESTIMATORS

    assert sorted(ESTIMATORS) == sorted(get_args(LearnerSection.model_fields["estimator"].annotation))
    assert all(cls.name == name for name, cls in ESTIMATORS.items())
    # what the config checks of a critic estimator (core/config.py) is what the classes say
    assert sorted(name for name, cls in ESTIMATORS.items() if cls.needs_critic) == sorted(CRITIC_ESTIMATORS)


def test_a_registered_estimator_drives_the_trainer_through_its_hooks(monkeypatch):
    """A new estimator, registered: the Trainer trains on its advantages, reports what it folds after the step,
    and a checkpoint keeps its state, without a line of the step naming it."""
    from turnstream.core.config_learner import LearnerSection
    from turnstream.learner.estimators import registry
    from turnstream.learner.estimators.base import Advantages, Estimator
    from turnstream.learner.step.trainer import Trainer
    from tests.learner_batches import synthetic_batch, tiny_causal_lm

    class EveryTokenOne(Estimator):
        name = "every_token_one"

        def __init__(self, cfg):
            super().__init__(cfg)
            self.steps = 0

        def advantages(self, batch, tb, old_values, agent_ids, episodes=None, cut_values=None) -> Advantages:
            return Advantages(torch.ones(tb.act_tokens.numel()), baseline_mean=0.25)

        def after_step(self, batch, tb, prox_logp, new_logp) -> dict[str, float]:
            self.steps += 1
            return {"spo_rho_mean": 1.0, "ones_folded": float(self.steps)}

        def state_dict(self) -> dict:
            return {"steps": self.steps}

    monkeypatch.setitem(registry.ESTIMATORS, EveryTokenOne.name, EveryTokenOne)
    cfg = LearnerSection(lr=1e-2, device="cpu").model_copy(update={"estimator": EveryTokenOne.name})
    trainer = Trainer(tiny_causal_lm(), cfg, seed=0)
    assert isinstance(trainer.estimator, EveryTokenOne) and trainer.net.critic is None
    before = [p.detach().clone() for p in trainer.net.model.parameters()]
    stats = trainer.step(synthetic_batch(4, seed=1))
    assert stats["baseline_mean"] == 0.25 and stats["ones_folded"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.net.model.parameters()))
    assert trainer.estimator.state_dict() == {"steps": 1}


def test_spo_reads_the_tracker_state_of_checkpoints_written_before():
    """tracker.json keeps its keys: SPO's state as the tracker wrote it, and the unused tracker a run of another
    estimator wrote, which SPO resumes from as a tracker that saw nothing."""
    from turnstream.core.config_learner import LearnerSection
    from turnstream.learner.estimators.registry import estimator_for

    written = {"config": {"rho_min": 0.5, "rho_max": 0.9, "d_half": 1.0}, "state": {"task-a": [3.0, 1.0]}}
    spo = estimator_for(LearnerSection(estimator="spo"))
    spo.load_state_dict(written)
    assert spo.state_dict() == written
    assert spo.success_estimates(["task-a", "task-b"]).tolist() == [0.75, 0.5]
    grpo = estimator_for(LearnerSection(estimator="grpo"))
    unused = grpo.state_dict()
    assert unused == {"config": {"rho_min": 0.875, "rho_max": 0.96, "d_half": 0.06}, "state": {}}
    spo.load_state_dict(unused)
    assert spo.changed_values(["task-a"]) == {"task-a": 0.5}
    assert grpo.changed_values(["task-a"]) == {}
