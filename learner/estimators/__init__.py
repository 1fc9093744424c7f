"""Advantage estimators: one interface (base.py), one class per estimator in its own module, chosen once from
`learner.estimator` by the registry (registry.py); the formulas as plain numpy functions (advantages.py), what they
read of a batch (episodes.py), SPO's tracker (tracker.py), the value networks of the critic-based estimators
(critic.py). Worked examples: docs/estimators.md."""
