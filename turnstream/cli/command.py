"""What a command of the `turnstream` program is: its name, its help line, the arguments it declares and its run.
Also the configuration arguments most commands share, and the configuration they load."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from turnstream.core.config import Config


@dataclass(frozen=True)
class Command:
    """One entry of the program's table (program.py). `run` gets the parsed arguments and returns the exit status;
    it imports what it needs itself, so that the parser never imports torch or vLLM."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """For a command that takes none."""


def config_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--config", required=required, help="TOML run configuration")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable), e.g. --set buffer.eta=0")


def load(args: argparse.Namespace, defaults: tuple[str, ...] = ()) -> Config:
    """The run configuration of `--config` with `--set` applied; `defaults` are overrides that `--set` overrides."""
    from turnstream.core.config import load_config

    return load_config(args.config, [*defaults, *args.set])


def checked(args: argparse.Namespace, defaults: tuple[str, ...] = ()) -> Config:
    """`load`'s configuration after the pre-flight checks (checks/preflight.py) of a command that starts a role."""
    from turnstream.checks.preflight import preflight

    return preflight(load(args, defaults))
