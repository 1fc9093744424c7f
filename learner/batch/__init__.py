"""A batch as the learner's tensors, below everything that trains on it: tensors.py (wire Batch -> TensorBatch,
the action log-probs from logits) and forward.py (a micro-batch's inputs and the network's forward at its action
positions). The step (learner/step/), the estimators and their critic (learner/estimators/) and a push's
verification probe (learner/sync/probe.py) read them; they import nothing else of the learner."""
