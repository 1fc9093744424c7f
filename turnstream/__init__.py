"""turnstream: asynchronous streaming actor-learner RL for multi-turn LLM agents.

One import name over the repository's top-level folders (pyproject.toml maps each; docs/architecture.md):

    core/        the ground layer: the run configuration and helpers every role uses
    protocol/    wire messages, codec, sockets, authentication, the roles' shared process lifecycle
    actors/      the actor role: environments, episode players, sampling from vLLM
    buffer/      the buffer role: the staleness-aware replay store and its listeners
    learner/     the learner role: the step, estimators, parallelism, weight pushes, checkpoints

and this folder, the roof over them, in rooms:

    cli/         the `turnstream` command: one table of commands, each its arguments and its run
    checks/      the checks before anything starts: pre-flight, a role's addresses
    launch/      the local launcher: role processes, restarts, vLLM servers, its own /metrics; the demo
    reports/     a run directory's logs read and plotted, the live progress line
    reference/   the reference pages generated from the code (configuration, metrics)
    models/      pretrained models from registry packages (`turnstream models get`)
    inspect/     what a recorded run's steps trained on (`turnstream inspect`, `turnstream regenerate`)
    replay/      a recorded run's learner retrained and compared bit for bit (`turnstream replay`)
    sft/         a supervised warm start on chat transcripts (`turnstream sft`)
    warm_start/  a tiny model that can read (`turnstream make-tiny-model DIR --warm-start`)

and two modules: tiny_model.py (the tiny local model, nothing downloaded) and keygen.py (CURVE keys).
"""

__version__ = "0.1.0"
