"""The commands that read a run directory: report (its learning curve and plots), and, for a run recorded with
learner.record, replay, inspect and regenerate."""
from __future__ import annotations

import argparse

from turnstream.cli.command import Command


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    from turnstream.replay.run import add_arguments

    add_arguments(p)


def _run_replay(args: argparse.Namespace) -> int:
    from turnstream.replay.run import main

    return main(args)


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")


def _run_report(args: argparse.Namespace) -> int:
    from turnstream.reports.figures import main

    return main(args.run_dir)


def _inspect_arguments(p: argparse.ArgumentParser) -> None:
    from turnstream.inspect.commands import add_inspect_arguments

    add_inspect_arguments(p)


def _run_inspect(args: argparse.Namespace) -> int:
    from turnstream.inspect.commands import run_inspect

    return run_inspect(args)


def _regenerate_arguments(p: argparse.ArgumentParser) -> None:
    from turnstream.inspect.commands import add_regenerate_arguments

    add_regenerate_arguments(p)


def _run_regenerate(args: argparse.Namespace) -> int:
    from turnstream.inspect.commands import run_regenerate

    return run_regenerate(args)


REPLAY = Command("replay", "retrain a recorded run's learner (learner.record) on its batches, without vLLM, actors "
                 "or buffer, and compare with its checkpoints", _replay_arguments, _run_replay)
REPORT = Command("report", "plot a run directory's learning curve", _report_arguments, _run_report)
INSPECT = Command("inspect", "show what a recorded run's learner steps trained on: episodes, staleness, advantages, "
                  "importance weights (text or HTML)", _inspect_arguments, _run_inspect)
REGENERATE = Command("regenerate", "sample a recorded episode's turns again with the weights that sampled them and "
                     "compare token for token", _regenerate_arguments, _run_regenerate)
