"""The `turnstream` command. Heavy imports (torch, vLLM) happen only inside the chosen subcommand."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from turnstream.cli import model_commands, record_commands, role_commands, run_commands, tool_commands
from turnstream.cli.command import Command

# in the order `turnstream --help` lists them
COMMANDS: tuple[Command, ...] = (
    run_commands.DEMO, run_commands.UP, run_commands.CHECK,
    role_commands.BUFFER, role_commands.LEARNER, role_commands.ACTOR,
    model_commands.SFT, role_commands.VLLM, model_commands.MAKE_TINY_MODEL, model_commands.MODELS,
    model_commands.EXPORT,
    record_commands.REPLAY, record_commands.REPORT, record_commands.INSPECT, record_commands.REGENERATE,
    tool_commands.ENVS, tool_commands.KEYGEN, tool_commands.BENCH,
)


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands:
        p = sub.add_parser(command.name, help=command.help)
        command.arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None, commands: Sequence[Command] = COMMANDS) -> int:
    args = build_parser(commands).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from turnstream.core.configtools import ConfigError
    from turnstream.launch.supervisor import RoleFailed

    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"turnstream: config error: {exc}", file=sys.stderr)
        return 2
    except RoleFailed as exc:  # the run stopped because a role failed: its log tail, then one line
        if exc.log_tail:
            print(exc.log_tail, file=sys.stderr)
        print(f"turnstream: run stopped: {exc}", file=sys.stderr)
        return 1
