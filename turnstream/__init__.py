"""turnstream: asynchronous streaming actor-learner RL for multi-turn LLM agents.

One import name over the repository's top-level folders (pyproject.toml maps each; docs/architecture.md):

    core/        the ground layer: the run configuration and helpers every role uses
    protocol/    wire messages, codec, sockets, authentication, the roles' shared process lifecycle
    actors/      the actor role: environments, episode players, sampling from vLLM
    buffer/      the buffer role: the staleness-aware replay store and its listeners
    learner/     the learner role: the step, estimators, parallelism, weight pushes, checkpoints

and this folder, the roof over them: the CLI (cli.py), pre-flight checks, the launcher, the demo, reports, and
the tools that each have a folder of their own:

    models/      pretrained models from registry packages (`turnstream models get`)
    inspect/     what a recorded run's steps trained on (`turnstream inspect`, `turnstream regenerate`)
    replay/      a recorded run's learner retrained and compared bit for bit (`turnstream replay`)
    sft/         a supervised warm start on chat transcripts (`turnstream sft`)
    warm_start/  a tiny model that can read (`turnstream make-tiny-model DIR --warm-start`)
"""

__version__ = "0.1.0"
