"""`turnstream bench start-success`: the success rate a model starts each task at, through the real sampling path.

A vLLM server serves `--model` (started here, with the defaults' vllm settings, or `--url`: one already serving
it) and the actor's environment loop plays `--episodes` episodes of each task with the actor's sampling settings
(the defaults, and the task's own: the trails' one-turn contexts), nothing trained and nothing streamed. Episode i
plays reset seed i. The tasks are those the model was warm-started on (its turnstream_model.json), else
turnstream/warm_start's defaults, or `--tasks`. Prints a line per task, then one JSON line:
{"model": "...", "results": {"<task>": {"success": s, "episodes": n, "solver_success": s or null}}}, where
solver_success is the rate the warm start aimed at (null for a task it did not train).
"""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from turnstream.actors.evaluation import SCORED
from turnstream.core.config import Config, load_config
from turnstream.warm_start.episodes import DEFAULT_TASKS, WarmTask, task_named


class _Unsent:
    """The link of episodes that are measured, not trained: every chunk is dropped."""

    learner_version = 0

    async def send(self, chunk) -> None:
        return None


async def task_success(url: str, model_dir: str | Path, task: WarmTask, episodes: int) -> float:
    """The share of `episodes` episodes of `task` that succeed, sampled from the server at `url` as an actor
    with the default settings (and the task's) samples."""
    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.actors.inference.fleet import InferenceFleet
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.actors.play.context import PlayContext, Sampling
    from turnstream.actors.play.env_loop import EnvironmentLoop
    from turnstream.actors.play.player import Episode
    from turnstream.actors.envs.registry import make_env

    cfg = load_config(None, task.actor_settings())
    a = cfg.actor
    player = EnvironmentLoop(lambda: make_env(task.env, **task.args))
    slots = asyncio.Semaphore(a.concurrent_episodes)
    async with InferenceFleet([url], a.request_timeout_s) as client:
        ctx = PlayContext("start-success", 0, ChatTokens(model_dir), client, _Unsent(),
                          Sampling.from_config(cfg), ActorMetrics())

        async def one(seed: int) -> str:
            async with slots:
                return await player.play(ctx, Episode(f"start-{task.env}-{seed}", seed, None))

        outcomes = await asyncio.gather(*(one(seed) for seed in range(episodes)))
    scored = [o for o in outcomes if o in SCORED]
    return scored.count("success") / max(1, len(scored))


def warm_started_tasks(model_dir: str | Path) -> dict[str, dict]:
    """task env -> the warm start's report of it (a TaskReport's fields), from the model's MODEL_INFO ({} if
    none): what this benchmark measures the model on."""
    from turnstream.warm_start.build import MODEL_INFO

    try:
        info = json.loads((Path(model_dir) / MODEL_INFO).read_text())
    except (OSError, ValueError):
        return {}
    return {t["env"]: t for t in info.get("warm_start", {}).get("tasks", [])}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="turnstream bench start-success", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="runs/tiny-model", help="a checkpoint directory (the tokenizer is read here)")
    p.add_argument("--tasks", default="", help="comma-separated environments with a scripted solver; default: "
                   "the model's warm-start tasks, else " + ",".join(DEFAULT_TASKS))
    p.add_argument("--episodes", type=int, default=400, help="per task")
    p.add_argument("--url", default="", help="a vLLM server already serving --model")
    args = p.parse_args(argv)
    trained = warm_started_tasks(args.model)
    names = [t for t in args.tasks.split(",") if t] or list(trained) or list(DEFAULT_TASKS)
    tasks = {name: (WarmTask(name, trained[name]["args"], trained[name]["context_turns"]) if name in trained
                    else task_named(name)) for name in names}
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    procs = ProcessGroup(Path("runs") / "bench-start-success")
    try:
        url = args.url or start_vllm_server(procs, args.model, Config().vllm)
        results = {}
        for name, task in tasks.items():
            success = asyncio.run(task_success(url, args.model, task, args.episodes))
            results[name] = {"success": round(success, 3), "episodes": args.episodes,
                             "solver_success": trained.get(name, {}).get("solver_success")}
            print(f"{name:<24} success {success:.3f} over {args.episodes} episodes", flush=True)
    finally:
        procs.stop_all()
    print(json.dumps({"model": str(args.model), "results": results}))
    return 0
