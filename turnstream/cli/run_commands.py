"""The commands that run, or only check, a whole run from one configuration: demo, up, check."""
from __future__ import annotations

import argparse

from turnstream.cli.command import Command, checked, config_arguments

DEMO_DEFAULTS = ("run.name=demo", "run.run_dir=runs/demo")  # without --config: the built-in defaults, named


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    config_arguments(p, required=False)


def _run_demo(args: argparse.Namespace) -> int:
    from turnstream.launch.demo import main

    return main(checked(args, () if args.config else DEMO_DEFAULTS))


def _up_arguments(p: argparse.ArgumentParser) -> None:
    config_arguments(p)
    p.add_argument("--resume", action="store_true", help="continue the stopped or crashed run in run.run_dir (its "
                   "latest learner checkpoint, the buffer's log, the task positions); without it a used run "
                   "directory is refused")


def _run_up(args: argparse.Namespace) -> int:
    from turnstream.launch.up import up

    return up(checked(args), resume=args.resume)


def _run_check(args: argparse.Namespace) -> int:
    from turnstream.checks.preflight import check_models

    cfg = checked(args)
    check_models(cfg)
    print(cfg.dumps(), end="")
    return 0


DEMO = Command("demo", "train the tiny model on the toy task with every role as a process", _demo_arguments,
               _run_demo)
UP = Command("up", "start vLLM, buffer, learner and actors locally", _up_arguments, _run_up)
CHECK = Command("check", "validate a config (and its pre-flight checks) without starting anything; prints the "
                "resolved config", config_arguments, _run_check)
