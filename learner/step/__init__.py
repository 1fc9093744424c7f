"""One learner step, batch -> tensors -> (values, pi_prox) -> advantages -> updates -> version.

trainer.py (the Trainer and its step), packing.py (micro-batches and their share per rank), step_inputs.py
(what the updates read), objective.py and loss.py (the loss), step_stats.py (the step's numbers). The batch's
tensors and a micro-batch's forward are learner/batch/'s, which the estimators read too.
"""
