"""Where an actor's task source stands, kept on disk so that a restarted actor goes on from there.

Only the `sequential` order has a position worth keeping: its draws are a fixed sequence of epochs (the run's
seed shuffles each one), so the number of draws made says where the actor is. `random` and `spo` draw afresh
in every incarnation (a restarted actor has a new epoch, hence a new seed), which is what they promise.

The saved number is `TaskSource.resume_point()`, the first draw not yet played in full: the episodes a killed
actor had in flight are played again by its successor (they never reached a batch: the buffer abandons a
partial episode), so an epoch is neither re-drawn from its start nor left with holes. The file is replaced
atomically every `interval_s` and when the actor stops; a `kill -9` loses at most the draws of the last
interval, which are then played twice.

The file names what it is a position in (task count, run seed, shard, group size): a run restarted with
another task list, seed or actor count starts from the beginning, with a warning, instead of misreading it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from turnstream.actors.tasks.orders import SequentialOrder
from turnstream.actors.tasks.source import TaskSource

log = logging.getLogger("turnstream.actor.tasks")


def position_path(run_dir: str | Path, actor_index: int) -> Path:
    return Path(run_dir) / "tasks" / f"actor-{actor_index}.json"


def identity(source: TaskSource) -> dict:
    """What a saved position is a position in."""
    order: SequentialOrder = source.order  # type: ignore[assignment]
    return {"tasks": order.num_tasks, "run_seed": order.run_seed, "shard": order.shard,
            "num_shards": order.num_shards, "group_size": source.group_size}


def save_position(path: Path, source: TaskSource) -> int:
    draws = source.resume_point()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"draws": draws, **identity(source)}))
    os.replace(tmp, path)
    return draws


def restore_position(path: Path, source: TaskSource) -> int | None:
    """Set `source` to the saved position; the number of draws it resumes at, or None (nothing usable saved)."""
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("task position %s unreadable (%s): starting from the first draw", path, exc)
        return None
    if not isinstance(saved, dict) or {k: saved.get(k) for k in identity(source)} != identity(source) \
            or not isinstance(saved.get("draws"), int) or saved["draws"] < 0:
        log.warning("task position %s is of another task list, seed or actor count (%s, now %s): starting from "
                    "the first draw", path, saved, identity(source))
        return None
    source.resume(saved["draws"])
    return saved["draws"]


async def keep_saving(path: Path, source: TaskSource, interval_s: float = 2.0) -> None:
    """Save the position every interval_s while it changes (the actor saves it once more when it stops)."""
    saved = None
    while True:
        if source.resume_point() != saved:
            saved = save_position(path, source)
        await asyncio.sleep(interval_s)
