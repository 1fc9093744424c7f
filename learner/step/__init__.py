"""One learner step, batch -> tensors -> (values, pi_prox) -> advantages -> updates -> version.

trainer.py (the Trainer and its step), batching.py (wire Batch -> tensors, action log-probs), packing.py
(micro-batches and their share per rank), forward.py (a micro-batch's forward), step_inputs.py (what the
updates read), objective.py and loss.py (the loss), step_stats.py (the step's numbers).
"""
