"""`turnstream replay RUN_DIR [--to-step N] [--from-checkpoint PATH] [--set SECTION.KEY=VALUE ...] [--jobs N]`.

Retrains the recorded steps (learner/record/) in order from the run's start or a checkpoint, on as many ranks as
the run's learner had (it starts itself under torchrun for more than one), and at each of the run's checkpoints
compares its own state with the run's, tensor by tensor (compare.py). Prints a line per checkpoint compared and one
JSON line last. With --set it trains the same batches under changed settings: an A/B of the learner on identical
data, whose lines say how far the result moved from the run's.

Only a checkpoint of the run compares anything: `compared_through` in the JSON is the last step compared, and the
replayed steps no checkpoint followed (every killed run's tail, the steps before a lost one) are listed as
`uncompared`, never as equal. The exit status (verdict.py) is 0 when every checkpoint compared was equal (or the
A/B compared one), 1 when one differs, and 3 when the replay reached no checkpoint at all.

A replay is the learner's own compute, step after step, so it is faster than the run only by what the run spent
otherwise (starting, waiting for data, sharing cores with generation). `--jobs N` checks a run N chains at a time:
the steps are cut at N-1 of the run's checkpoints, and each chain is replayed by a process of its own from the
checkpoint it starts at. A chain that ends equal to the run's checkpoint hands the next chain exactly the state it
starts from, so N chains that each end equal prove what one chain would.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from turnstream.core.configtools import ConfigError
from turnstream.replay.verdict import DIFFERS, EQUAL, NOTHING_COMPARED, exit_status, nothing_compared

log = logging.getLogger("turnstream.replay")

# the learner.jsonl statistics the final line compares between the run and the replay (means over the steps)
COMPARED_STATS = ("policy_loss", "step_kl", "entropy", "grad_norm", "approx_kl", "clip_fraction")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory whose learner ran with learner.record = true")
    p.add_argument("--to-step", type=int, default=None, help="stop after this step (version); default: the last")
    p.add_argument("--from-checkpoint", default=None, help="start from this checkpoint directory instead of the "
                   "run's start (its model.path at version 0, or the checkpoint its first learner resumed)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="train the recorded batches under a changed setting (repeatable), e.g. --set learner.lr=1e-4")
    p.add_argument("--jobs", type=int, default=1, help="check the run in this many chains at once, each from one of "
                   "its checkpoints (not with --set: an A/B is one chain)")
    p.add_argument("--ranks", type=int, default=0, help="data-parallel ranks; default: as many as the run's learner "
                   "had (bit for bit needs the same number: the gradient sum's order depends on it)")
    p.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms (GPU replays; "
                   "the CPU kernels are deterministic already)")
    p.add_argument("--out", default=None, help="where the replay's per-step statistics go (replay.jsonl); default "
                   "RUN_DIR/replay")


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    from turnstream.learner.record.reader import RecordError, open_record
    from turnstream.replay.rebuild import start_of

    try:
        record = open_record(args.run_dir)
        start = start_of(record, args.from_checkpoint)
        steps = list(record.steps(start.version + 1, args.to_step))
    except RecordError as exc:
        raise ConfigError(str(exc)) from None
    if not steps:
        raise ConfigError(f"replay: no recorded step after version {start.version} (the record holds "
                          f"{record.describe_range()})")
    if args.jobs > 1:
        if args.set:
            raise ConfigError("replay: --jobs checks the run's own steps; an A/B (--set) trains one chain")
        return _in_chains(args, record, start, steps, started)
    owner = steps[0].incarnation
    ranks = args.ranks or owner.world
    if ranks > 1 and "WORLD_SIZE" not in os.environ:
        return _under_torchrun(args, ranks)
    if args.deterministic:  # before any CUDA work: cuBLAS reads it when its handle is made
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return _replay(args, record, start, steps, owner.config(args.set), started)


def _argv(args: argparse.Namespace, **changed) -> list[str]:
    """This command's arguments, with `changed` ones (ranks, from_checkpoint, to_step, out) replaced."""
    a = {**vars(args), **changed}
    return [a["run_dir"], *(["--ranks", str(a["ranks"])] if a["ranks"] else []),
            *(["--to-step", str(a["to_step"])] if a["to_step"] is not None else []),
            *(["--from-checkpoint", str(a["from_checkpoint"])] if a["from_checkpoint"] else []),
            *(x for item in a["set"] for x in ("--set", item)), *(["--deterministic"] if a["deterministic"] else []),
            *(["--out", str(a["out"])] if a["out"] else [])]


def _torchrun(ranks: int) -> list[str]:
    from turnstream.launch.processes import free_port

    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
            "127.0.0.1", "--master-port", str(free_port()), "-m", "turnstream.cli", "replay"]


def _under_torchrun(args: argparse.Namespace, ranks: int) -> int:
    """The replay on `ranks` ranks, its lines passed through. torchrun turns any rank's non-zero status into its
    own 1, so the status is read from rank 0's final line."""
    proc = subprocess.Popen(_torchrun(ranks) + _argv(args, ranks=ranks), env=_quiet_threads(), stdout=subprocess.PIPE,
                            text=True)
    last = ""
    for line in proc.stdout:
        print(line, end="", flush=True)
        last = line if line.strip() else last
    proc.wait()
    try:
        summary = json.loads(last)
    except ValueError:  # it failed before its final line: torchrun's status says so
        return proc.returncode
    return _status(summary, ab=bool(args.set))


def _status(summary: dict, ab: bool) -> int:
    """An A/B is expected to differ: it fails only by comparing nothing."""
    return exit_status(summary["checkpoints_compared"], differs=not summary["equal"] and not ab)


def _closing_lines(summary: dict, checkpoints: dict[int, Path]) -> list[str]:
    """What the replay did not compare: the replayed steps after its last comparison, or that it compared
    nothing."""
    if summary["checkpoints_compared"]:
        return [f"steps {a}..{b} replayed, not compared: the run has no checkpoint in them"
                for a, b in summary["uncompared"]]
    if not summary["steps"]:
        return [nothing_compared("no step was replayed")]
    return [nothing_compared(f"the replay of steps {summary['from'] + 1}..{summary['to']} reached no checkpoint "
                             f"of the run (its checkpoints: {', '.join(map(str, sorted(checkpoints))) or 'none'})")]


def _quiet_threads() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # torchrun warns otherwise


def _start_after_lost_step(version: int, checkpoints: dict, emit):
    """Where the replay goes on after a step that was taken but not recorded: the first checkpoint at or after
    it, or None (the replay stops) when none follows."""
    from turnstream.replay.rebuild import Start

    after = sorted(v for v in checkpoints if v >= version)
    emit(f"step {version} is lost (taken but not recorded)" + (
        f": continuing from checkpoint {after[0]}" if after else
        " and no checkpoint follows it: the replay stops here"), flush=True)
    return Start(after[0], checkpoints[after[0]]) if after else None


def _stats_file(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    return (out / "replay.jsonl").open("w")


def _compare_with_checkpoint(trainer, version: int, checkpoints: dict, out: Path, rank: int,
                             world: int) -> dict | None:
    """The replayed weights at `version` against the run's own checkpoint there: a result on rank 0, else None."""
    from turnstream.learner.checkpoint import store
    from turnstream.learner.checkpoint.layout import tmp_name
    from turnstream.learner.parallel.ranks import broadcast
    from turnstream.replay.compare import compare

    tmp = broadcast(tmp_name(version, os.getpid()), rank, world)
    mine = None
    if rank == 0 or store.writes_sharded(trainer):  # a sharded save is a collective
        mine = store.save(out / "compare", trainer, checkpoints[version] / "model", keep=1, tmp=tmp)
    if rank != 0:
        return None
    result = compare(checkpoints[version], mine)
    shutil.rmtree(mine, ignore_errors=True)
    return {"version": version, "equal": result.equal, "max_abs_diff": result.max_abs_diff,
            "differing": len(result.counted_differences),
            "first_difference": next(iter(result.counted_differences), ""), "summary": result.summary()}


def _replay(args, record, start, steps, cfg, started: float) -> int:
    import torch

    from turnstream.learner.main import start_rank
    from turnstream.learner.parallel.ranks import shutdown
    from turnstream.replay.rebuild import Stepper, build, run_checkpoints

    run_dir = Path(args.run_dir)
    torch.use_deterministic_algorithms(bool(args.deterministic))
    rank, world = start_rank(cfg)
    out = Path(args.out) if args.out else run_dir / "replay"
    emit = print if rank == 0 else (lambda *a, **k: None)
    checkpoints = run_checkpoints(run_dir)
    results, lost, replayed = [], [], []
    uncompared, unchecked_from = [], None  # [first, last] of steps no checkpoint followed; first since the last one
    try:
        stepper = Stepper(build(cfg, start, rank, world))
        emit(f"replaying steps {steps[0].version}..{steps[-1].version} of {run_dir} from {start.describe()} on "
             f"{world} rank(s), {stepper.trainer.device}" + (f", with {' '.join(args.set)}" if args.set else ""),
             flush=True)
        stats_file = _stats_file(out) if rank == 0 else None
        for recorded in steps:
            if stepper.trainer.version >= recorded.version:  # a checkpoint past a lost step covered it
                continue
            if recorded.lost:
                lost.append(recorded.version)
                uncompared += _unchecked(unchecked_from, stepper.trainer.version)
                unchecked_from = None
                restart = _start_after_lost_step(recorded.version, checkpoints, emit)
                if restart is None:
                    break
                del stepper
                gc.collect()
                stepper = Stepper(build(cfg, restart, rank, world))
                continue
            stats = stepper.step(recorded)
            replayed.append(stats)
            unchecked_from = recorded.version if unchecked_from is None else unchecked_from
            if stats_file is not None:
                stats_file.write(json.dumps(stats) + "\n")
            if recorded.version in checkpoints:
                unchecked_from = None
                result = _compare_with_checkpoint(stepper.trainer, recorded.version, checkpoints, out, rank, world)
                if result is not None:
                    results.append(result)
                    emit(f"step {recorded.version}: {result.pop('summary')}", flush=True)
        if stats_file is not None:
            stats_file.close()
        uncompared += _unchecked(unchecked_from, stepper.trainer.version)
        summary = _summary(args, record, start, steps, started, results, lost, stepper.rng_mismatches,
                           to=stepper.trainer.version, trained=len(replayed), ranks=world,
                           device=str(stepper.trainer.device), stats=_stats_against_run(run_dir, replayed),
                           uncompared=uncompared)
        for line in _closing_lines(summary, checkpoints):
            emit(line, flush=True)
        emit(json.dumps(summary), flush=True)
        return _status(summary, ab=bool(args.set)) if rank == 0 else EQUAL
    finally:
        gc.collect()  # the trainer (DDP holds the group) before the group: learner/main.py says why
        shutdown(world)


def _in_chains(args, record, start, steps, started: float) -> int:
    """--jobs: the steps in args.jobs chains cut at the run's checkpoints, each replayed by a process of its own."""
    from turnstream.replay.rebuild import run_checkpoints

    checkpoints = run_checkpoints(Path(args.run_dir))
    first, last = start.version, steps[-1].version
    inner = [v for v in sorted(checkpoints) if first < v < last]
    cuts = sorted({min(inner, key=lambda v: abs(v - (first + i * (last - first) / args.jobs)))
                   for i in range(1, args.jobs)} if inner else set())
    chains = list(zip([first, *cuts], [*cuts, last]))
    out = Path(args.out) if args.out else Path(args.run_dir) / "replay"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "turnstream.cli", "replay", *_argv(
            args, jobs=1, to_step=b, out=out / f"chain-{a:06d}",
            from_checkpoint=checkpoints[a] if a != first else args.from_checkpoint)],
        stdout=subprocess.PIPE, text=True, env=_quiet_threads()) for a, b in chains]
    outputs = [p.communicate()[0].strip().splitlines() for p in procs]
    if any(p.returncode not in (EQUAL, DIFFERS, NOTHING_COMPARED) or not lines for p, lines in zip(procs, outputs)):
        raise ConfigError("replay: a chain failed: " + " | ".join(lines[-1] if lines else "no output"
                                                                  for lines in outputs))
    parts = [json.loads(lines[-1]) for lines in outputs]
    for part, lines in zip(parts, outputs):  # what a chain did not compare is said once, for the whole replay
        closing = set(_closing_lines(part, checkpoints))
        print("\n".join(line for line in lines[:-1] if line not in closing), flush=True)
    summary = _summary(args, record, start, steps, started,
                       [c for p in parts for c in p["checkpoints"]], [v for p in parts for v in p["lost"]],
                       sum(p["rng_mismatches"] for p in parts), to=parts[-1]["to"],
                       trained=sum(p["steps"] for p in parts), ranks=parts[0]["ranks"],
                       device=parts[0]["device"], stats=_merged_stats(parts),
                       uncompared=[r for p in parts for r in p["uncompared"]])
    summary.update(jobs=args.jobs, chains=[list(c) for c in chains])
    for line in _closing_lines(summary, checkpoints):
        print(line, flush=True)
    print(json.dumps(summary), flush=True)
    return _status(summary, ab=False)


def _unchecked(first: int | None, last: int) -> list[list[int]]:
    """The replayed steps `first`..`last` that no comparison covers (none when `first` is None)."""
    return [] if first is None else [[first, last]]


def _summary(args, record, start, steps, started: float, results: list[dict], lost: list[int], rng_mismatches: int,
             *, to: int, trained: int, ranks: int, device: str, stats: dict, uncompared: list[list[int]]) -> dict:
    """The final JSON line: what was replayed, each checkpoint compared and the last step compared (`equal` says
    nothing of the steps after it), the statistics beside the run's, and the seconds the replay took (from its
    start, imports included) against the run's over the same steps."""
    replay_s = time.monotonic() - started
    done = [s for s in steps if not s.lost]
    before = [s for s in record.steps(start.version, start.version) if not s.lost]
    began = before[0].time if before else steps[0].incarnation.started  # the learner's start for step 1
    run_s = done[-1].time - began if done else 0.0
    return {"run_dir": str(args.run_dir), "from": start.version, "to": to, "steps": trained,
            "ranks": ranks, "device": device, "overrides": list(args.set), "deterministic": args.deterministic,
            "lost": lost, "superseded": len(record.superseded()), "checkpoints_compared": len(results),
            "compared_through": max((r["version"] for r in results), default=None), "uncompared": uncompared,
            "equal": bool(results) and all(r["equal"] for r in results),
            "max_abs_diff": max((r["max_abs_diff"] for r in results), default=0.0), "rng_mismatches": rng_mismatches,
            "checkpoints": results, "stats": stats, "replay_s": round(replay_s, 2), "run_s": round(run_s, 2),
            "speedup": round(run_s / replay_s, 2) if replay_s > 0 else None}


def _stats_against_run(run_dir: Path, replayed: list[dict]) -> dict:
    """Means over the replayed steps of COMPARED_STATS, the run's (learner.jsonl, the last line of a version: the
    lineage's) beside the replay's, with the number of steps they are over."""
    from turnstream.reports.run_log import steps_by_version

    logged = steps_by_version(run_dir)
    versions = [s["version"] for s in replayed]
    out = {}
    for name in COMPARED_STATS:
        mine = [s[name] for s in replayed if name in s]
        theirs = [logged[v][name] for v in versions if v in logged and name in logged[v]]
        if mine:
            out[name] = {"run": sum(theirs) / len(theirs) if theirs else None, "replay": sum(mine) / len(mine),
                         "steps": len(mine)}
    return out


def _merged_stats(parts: list[dict]) -> dict:
    """The chains' means, weighted by their steps."""
    out = {}
    for name in COMPARED_STATS:
        pieces = [p["stats"][name] for p in parts if name in p["stats"]]
        n = sum(x["steps"] for x in pieces)
        if n:
            out[name] = {side: (sum(x[side] * x["steps"] for x in pieces) / n
                                if all(x[side] is not None for x in pieces) else None) for side in ("run", "replay")}
            out[name]["steps"] = n
    return out
