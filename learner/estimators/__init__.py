"""Advantage estimators: the formulas as plain numpy functions (advantages.py), the SPO tracker (spo.py), the
value networks of the critic-based estimators (critic.py), and the one interface from a batch to per-token
advantages and critic targets for `learner.estimator` (compute.py). Worked examples: docs/estimators.md."""
