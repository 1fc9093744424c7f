"""One process of a role, as `turnstream up` starts it and as deployments that start each process themselves do
(deploy/): buffer, learner, actor, and vllm, a policy server."""
from __future__ import annotations

import argparse
import os

from turnstream.cli.command import Command, checked, config_arguments, load


def _role_config(args: argparse.Namespace, role: str):
    """The checked configuration, and every address the role binds or reaches checked before it starts."""
    from turnstream.checks.addresses import check_role_addresses

    cfg = checked(args)
    check_role_addresses(cfg, role)
    return cfg


def _run_buffer(args: argparse.Namespace) -> int:
    cfg = _role_config(args, "buffer")
    from turnstream.buffer.main import main

    main(cfg)
    return 0


def _run_learner(args: argparse.Namespace) -> int:
    cfg = _role_config(args, "learner")
    from turnstream.learner.main import main

    main(cfg)
    return 0


def _actor_arguments(p: argparse.ArgumentParser) -> None:
    config_arguments(p)
    p.add_argument("--index", type=int, default=0, help="actor index (names it and offsets its metrics port)")


def _run_actor(args: argparse.Namespace) -> int:
    cfg = _role_config(args, "actor")
    from turnstream.actors.main import main

    main(cfg, args.index)
    return 0


def _vllm_arguments(p: argparse.ArgumentParser) -> None:
    config_arguments(p)
    p.add_argument("--port", type=int, default=8000, help="the port it serves on")


def _run_vllm(args: argparse.Namespace) -> int:
    """HTTP only: the environment, buffer and keys are not its business (its host holds no ZeroMQ keys). exec'd, so
    that the server is this process and a signal to it reaches vLLM."""
    from turnstream.launch.vllm_server import vllm_command

    cfg = load(args)
    argv, env = vllm_command(cfg.model.path, cfg.network.listen_host, args.port, cfg.vllm, cfg.learner.lora)
    os.execve(argv[0], argv, {**os.environ, **env})


BUFFER = Command("buffer", "run the buffer process", config_arguments, _run_buffer)
LEARNER = Command("learner", "run the learner process", config_arguments, _run_learner)
ACTOR = Command("actor", "run one actor process", _actor_arguments, _run_actor)
VLLM = Command("vllm", "run one vLLM server of model.path on network.bind_host, as `turnstream up` starts it (for "
               "deployments that start each role themselves: deploy/slurm)", _vllm_arguments, _run_vllm)
