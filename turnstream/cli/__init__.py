"""The `turnstream` command line: one table of commands, each an entry that declares its arguments and its run.

    program.py          the table, the parser built from it, and `main` (the console script and `python -m
                        turnstream.cli`, which the launcher and the deployments start roles with)
    command.py          what a command is, and the configuration arguments most commands share
    run_commands.py     demo, up, check
    role_commands.py    buffer, learner, actor, vllm: one process of a role
    model_commands.py   make-tiny-model, models, export, sft
    record_commands.py  report, replay, inspect, regenerate: what a run directory holds
    tool_commands.py    envs, keygen, bench (bench.py: a source checkout's benchmarks)

Adding a command is one `Command` in one of these modules and its entry in program.py's table.
"""
from turnstream.cli.program import build_parser, main

__all__ = ["build_parser", "main"]
