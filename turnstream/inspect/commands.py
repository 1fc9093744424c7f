"""The `turnstream inspect` and `turnstream regenerate` command lines (light: torch and vLLM load only when run)."""
from __future__ import annotations

import argparse
import contextlib


def _overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a setting of the run's recorded config (repeatable), e.g. --set model.path=... "
                   "where the run's starting weights moved")


def add_inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory recorded with learner.record = true")
    p.add_argument("--step", type=int, action="append", default=None, metavar="N",
                   help="show step N (the step that produced policy version N; repeatable); without it, a line per "
                   "recorded step")
    p.add_argument("--episode", action="append", default=[], metavar="ID",
                   help="render this episode of the step(s) as text, token by token (repeatable)")
    p.add_argument("--html", metavar="OUT_DIR", help="write a page per shown step (every step without --step) and "
                   "an index to OUT_DIR, tokens coloured by advantage")
    p.add_argument("--no-learner", action="store_true", help="do not rebuild the learner: no learner log-probs, "
                   "importance weights, nor advantages of estimators that read the learner's state (SPO's "
                   "tracker, a critic)")
    _overrides(p)


def add_regenerate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory recorded with learner.record = true")
    p.add_argument("--episode", required=True, metavar="ID", help="the episode to sample again")
    p.add_argument("--step", type=int, metavar="N", help="only the turns step N trained (default: every step "
                   "that trained a turn of it)")
    p.add_argument("--url", help="a running vLLM server of the run's model to use (its weights are replaced by "
                   "each version's); default: start one with the run's [vllm] settings")
    p.add_argument("--no-replay", action="store_true", help="use only the weights the run kept (model.path, "
                   "pushed versions, checkpoints); by default any other version is rebuilt from the record")
    _overrides(p)


def run_inspect(args) -> int:
    from turnstream.inspect.main import main

    with _record_errors_as_config_errors():
        return main(args.run_dir, steps=args.step, episodes=args.episode, html=args.html,
                    learner=not args.no_learner, overrides=args.set)


def run_regenerate(args) -> int:
    from turnstream.inspect.regenerate import main

    with _record_errors_as_config_errors():
        return main(args.run_dir, args.episode, args.step, args.url, not args.no_replay, args.set)


@contextlib.contextmanager
def _record_errors_as_config_errors():
    """A missing or unreadable record, or a step it does not hold: one line naming it, exit 2 (turnstream/cli/)."""
    from turnstream.core.configtools import ConfigError
    from turnstream.learner.record.reader import RecordError

    try:
        yield
    except RecordError as exc:
        raise ConfigError(str(exc)) from None
