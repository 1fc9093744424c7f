"""Checkpoints of the learner: where they live and how they are published (layout.py), the single-file format of
ddp and one-process learners (single_file.py), the sharded format of fsdp2 (sharded.py, one file set per rank),
what a checkpoint holds of a Trainer (trainer_state.py), the interface the parallel strategy writes its
checkpoints through (formats.py), the one place a Trainer is saved and restored
(store.py), and `turnstream export` to a plain Hugging Face directory (export.py)."""
