"""The roof in rooms (docs/architecture.md): the CLI, the launcher and the reports are sub-packages of turnstream/;
the CLI is one table of commands, each declaring its arguments and its run, with no branch over command names;
no function of the roof's own rooms runs over 60 lines."""
from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

from turnstream.cli.command import Command
from turnstream.cli.program import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
ROOF = ROOT / "turnstream"
MAX_FUNCTION_LINES = 60


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_the_launcher_reports_and_cli_are_sub_packages():
    for name in ("turnstream.cli", "turnstream.launch", "turnstream.reports"):
        package = importlib.import_module(name)
        assert hasattr(package, "__path__"), f"{name} is a module, not a sub-package"


def test_every_command_is_one_table_entry_whose_run_its_parser_carries():
    names = [command.name for command in COMMANDS]
    assert len(names) == len(set(names)), names
    parsers = _subcommands(build_parser())
    assert list(parsers) == names
    for command in COMMANDS:
        assert parsers[command.name].get_default("run") is command.run, command.name


def test_a_new_command_is_one_entry_in_the_table(capsys):
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("word")

    def run(args: argparse.Namespace) -> int:
        print(f"said {args.word}")
        return 7

    table = (Command("say", "print a word", add, run),)
    assert main(["say", "hi"], commands=table) == 7
    assert capsys.readouterr().out == "said hi\n"


def test_the_cli_never_compares_with_a_command_name():
    names = {command.name for command in COMMANDS}
    found = []
    for path in sorted((ROOF / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                strings = {s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)}
                if strings & names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_no_function_of_the_roof_runs_over_60_lines():
    long = []
    for path in sorted(ROOF.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)
