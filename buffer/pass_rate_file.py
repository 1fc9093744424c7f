"""The pass-rate table of positive replay as a file a user reads: `<run_dir>/pass_rates.json`, hardest task first.

{"time": unix seconds, "hard_below": x, "tasks": [{"prompt_key", "pass_rate", "successes", "episodes"}, ...]},
rewritten (atomically) every few seconds while it changes, and once more when the buffer stops.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from turnstream.buffer.store.positive_replay import PositiveReplay

EVERY_S = 2.0


def write_pass_rates(path: Path, positive: PositiveReplay) -> None:
    table = positive.pass_rates.table()
    doc = {"time": time.time(), "hard_below": positive.hard_below,
           "tasks": [{"prompt_key": key, "pass_rate": round(r.rate, 4), "successes": r.successes,
                      "episodes": r.episodes} for key, r in table.items()]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


async def keep_writing(path: Path, positive: PositiveReplay, every_s: float = EVERY_S) -> None:
    """Rewrite the file every `every_s` seconds while the table changes, and once more when cancelled."""
    written = None
    try:
        while True:
            await asyncio.sleep(every_s)
            state = positive.completed_episodes, len(positive.kept)
            if state != written:
                write_pass_rates(path, positive)
                written = state
    finally:
        write_pass_rates(path, positive)
