"""`turnstream replay RUN_DIR`: retrain a recorded run's learner (learner/record/) from its starting weights or any
checkpoint on the recorded batches, in order, without vLLM, actors or buffer, and compare the result with the run's
own checkpoints tensor by tensor (run.py). rebuild.py replays steps into a Trainer (also `trainer_at`, a Trainer at
any recorded version, for tools that need a step's weights); compare.py compares two checkpoints; verdict.py is the
exit status of a comparison, which fails when it compared nothing (also `turnstream regenerate`'s)."""
