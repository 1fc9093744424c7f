"""A tiny model that can read: the tiny model warm-started on the shipped tasks' transcripts, played by scripted
solvers with a chosen share of mistakes (`turnstream make-tiny-model DIR --warm-start`, docs/learning.md).

    solvers.py    a solver per task, reading only what the model reads
    episodes.py   the tasks, and their episodes played on the real environments as chat transcripts
    calibrate.py  the share of mistakes at which a task's solver succeeds at a chosen rate
    build.py      the command: transcripts, then `turnstream sft`'s training, then the model directory
"""
