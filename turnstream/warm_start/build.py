"""`turnstream make-tiny-model DIR --warm-start`: the tiny model, trained on the shipped tasks' transcripts so that
it starts each task at a chosen success rate instead of chance.

The steps: build the tiny model (turnstream/tiny_model.py) aside; per task, find the share of mistakes at which
its solver succeeds at the chosen rate (calibrate.py), or take the share given, and play episodes of the real
environment with the solver at that share (episodes.py); train the tiny model on all the tasks' transcripts at
once with `turnstream sft`'s code (turnstream/sft/run.py, `warm_start`), in phases; write the result to DIR, with
what was done in its turnstream_model.json. Everything is seeded by the seed: the same arguments give the same model.
"""
from __future__ import annotations

import json
import logging
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.actors.envs.registry import make_env
from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError
from turnstream.sft.run import context_limit, warm_start
from turnstream.sft.transcripts import Refused, TranscriptRenderer
from turnstream.tiny_model import make_tiny_model
from turnstream.warm_start.calibrate import mistakes_for, solver_success
from turnstream.warm_start.episodes import DEFAULT_TASKS, WarmTask, play_many, task_named

log = logging.getLogger("turnstream.warm_start")

# padded micro-batches of transcripts of like length: a batch's one long transcript does not pad the others to it
MICROBATCH_TOKENS = 2048
# fixed, so that the same seed gives the same weights whatever the core count; one, because the model is small
# enough that a second thread hardly helps, and spinning threads crawl on a machine whose cores are all busy
SFT_THREADS = 1
MODEL_INFO = "turnstream_model.json"  # written by make_tiny_model; the warm start adds its own key


@dataclass(frozen=True)
class SftPhase:
    steps: int  # optimizer steps
    lr: float
    batch_transcripts: int


@dataclass(frozen=True)
class WarmStartPlan:
    tasks: list[WarmTask]
    success: float = 0.4  # the solver's success each task's share of mistakes is chosen for
    mistakes: float | None = None  # one share of mistakes for every task instead
    episodes: int = 500  # played per task
    # transcripts each task trains on, drawn from its episodes' or repeated: the same for every task (a trail, cut
    # into one-turn contexts, makes 55 from an episode and would outweigh the others), and many, so that the share
    # of mistakes the model learns is close to the data's
    task_transcripts: int = 4000
    # a fast phase that learns to read, then a slow one that settles the share of mistakes the model makes: at a
    # constant fast rate it is wherever the last few batches pushed it, and the start varies from seed to seed
    phases: tuple[SftPhase, ...] = (SftPhase(300, 3e-3, 32), SftPhase(100, 3e-4, 64))


@dataclass
class TaskReport:
    env: str
    args: dict
    context_turns: int
    mistakes: float  # share of the solver's answers that were mistakes
    solver_success: float  # the solver's success at that share: what the trained model should start at
    episodes: int
    transcripts: int  # played; each task trains on task_transcripts of those that fit
    over_context: int  # transcripts longer than the actors' context (vllm.max_model_len), left out
    actor_settings: list[str] = field(default_factory=list)


def make_reading_model(out_dir: str | Path, plan: WarmStartPlan, seed: int = 0) -> dict:
    """Build the tiny model of `seed`, warm-start it as `plan` says and write it to `out_dir` (new or empty);
    returns what was done (also in out_dir/turnstream_model.json, key "warm_start")."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"make-tiny-model: {out} exists and is not an empty directory")
    with tempfile.TemporaryDirectory(prefix=".tiny-base-", dir=out.parent if out.parent.exists() else None) as tmp:
        model = make_tiny_model(Path(tmp) / "phase-0", seed=seed)
        renderer = TranscriptRenderer(ChatTokens(model), context_limit(_sft_config(model, plan.phases[0], seed)))
        tasks, transcripts = [], []
        for task in plan.tasks:
            report, made = _task_transcripts(task, plan, seed, renderer)
            tasks.append(report)
            transcripts += made
        reports = []
        for i, phase in enumerate(plan.phases, 1):
            dest = out if i == len(plan.phases) else Path(tmp) / f"phase-{i}"
            reports.append(warm_start(transcripts, _sft_config(model, phase, seed), dest))
            model = dest
    info_path = out / MODEL_INFO
    info = json.loads(info_path.read_text())
    info["warm_start"] = {"plan": {k: v for k, v in asdict(plan).items() if k != "tasks"},
                          "tasks": [asdict(t) for t in tasks],
                          "sft": {"transcripts": reports[0].trained, "steps": [r.steps for r in reports],
                                  "loss_start": round(reports[0].loss_start, 4),
                                  "loss_end": round(reports[-1].loss_end, 4)}}
    info_path.write_text(json.dumps(info, indent=1) + "\n")
    return info["warm_start"]


def _task_transcripts(task: WarmTask, plan: WarmStartPlan, seed: int,
                      renderer: TranscriptRenderer) -> tuple[TaskReport, list[dict]]:
    """The task's share of mistakes, its episodes played at that share, and the transcripts it trains on."""
    if plan.mistakes is None:
        calibrated = mistakes_for(task, plan.success)
        share, success = calibrated.mistakes, calibrated.success
    else:
        share, success = plan.mistakes, solver_success(task, plan.mistakes)
    # episodes of the build's seed, none of them the calibration's
    played = play_many(task, range((seed + 1) * 10**6, (seed + 1) * 10**6 + plan.episodes), share)
    made = [t for p in played for t in p.transcripts(task.context_turns)]
    fits = [t for t in made if _fits(renderer, t)]  # the actor truncates a longer context: it never sees one
    report = TaskReport(task.env, task.args, task.context_turns, share, round(success, 4), plan.episodes, len(made),
                        len(made) - len(fits), task.actor_settings())
    log.info("%s: mistakes %.3f, solver success %.3f, %d transcripts (%d over the context)", task.env, share,
             success, len(made), report.over_context)
    return report, same_weight(fits, plan.task_transcripts, random.Random(f"warm-start/{task.env}/{seed}"))


def _fits(renderer: TranscriptRenderer, transcript: dict) -> bool:
    try:
        renderer.render(0, transcript)
    except Refused:
        return False
    return True


def same_weight(transcripts: list[dict], count: int, rng: random.Random) -> list[dict]:
    """`count` of `transcripts`: drawn from them when there are more, else all of them repeated, in a shuffled
    order, so that every task weighs the same in training however many contexts its episodes make."""
    if len(transcripts) >= count:
        return rng.sample(transcripts, count)
    order = rng.sample(transcripts, len(transcripts))
    return [order[i % len(order)] for i in range(count)]


def _sft_config(model_dir: Path, phase: SftPhase, seed: int) -> Config:
    cfg = Config()
    cfg.model.path = str(model_dir)
    cfg.run.seed = seed
    cfg.learner.device, cfg.learner.torch_threads = "cpu", SFT_THREADS
    cfg.learner.max_tokens_per_microbatch = MICROBATCH_TOKENS
    cfg.sft.max_steps, cfg.sft.epochs = phase.steps, 10**6  # steps bound the training, not passes
    cfg.sft.batch_transcripts, cfg.sft.lr = phase.batch_transcripts, phase.lr
    return cfg


def main(out_dir: str, seed: int, tasks: str = "", env_args: list[str] | None = None, success: float = 0.4,
         mistakes: float | None = None, episodes: int = 500) -> int:
    """`turnstream make-tiny-model DIR --warm-start ...`: prints one JSON line, what was done."""
    if not 0 < success <= 1 or not (mistakes is None or 0 <= mistakes <= 1) or episodes < 1:
        raise ConfigError("make-tiny-model: --success must be in (0, 1], --mistakes in [0, 1], --episodes >= 1")
    plan = WarmStartPlan(parse_tasks(tasks, env_args or []), success, mistakes, episodes)
    report = make_reading_model(out_dir, plan, seed)
    print(json.dumps({"model": str(out_dir), **report}))
    return 0


def parse_tasks(tasks: str, env_args: list[str]) -> list[WarmTask]:
    """`a,b,c` (environments with a solver) and `ENV=JSON` constructor arguments of some of them."""
    names = [t for t in tasks.split(",") if t] or list(DEFAULT_TASKS)
    args: dict[str, dict] = {}
    for item in env_args:
        env, _, text = item.partition("=")
        try:
            args[env] = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--env-args {item!r}: expected ENV=JSON object ({exc})") from None
        if env not in names or not isinstance(args[env], dict):
            raise ConfigError(f"--env-args {item!r}: ENV must be one of the tasks ({', '.join(names)}) and its "
                              "arguments a JSON object")
    try:
        chosen = [task_named(name, args.get(name)) for name in names]
    except ValueError as exc:
        raise ConfigError(f"--tasks: {exc}") from None
    for task in chosen:  # bad arguments fail here, in one line, not in the middle of the build
        try:
            make_env(task.env, **task.args)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"--env-args: {task.env}: {exc}") from None
    return chosen
