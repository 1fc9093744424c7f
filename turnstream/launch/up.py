"""`turnstream up`: the local stack run until the learner finishes, the time limit passes, or Ctrl-C/SIGTERM."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError
from turnstream.launch.stack import LocalStack
from turnstream.reports.progress import Progress
from turnstream.reports.run_log import read_steps

log = logging.getLogger("turnstream.launcher")

RUN_MARKERS = ("config.resolved.toml", "learner.jsonl", "checkpoints", "buffer-wal")


def check_run_dir(cfg: Config, resume: bool) -> None:
    """A run directory holds one run: a second `up` there without --resume would mix two runs' data."""
    run_dir = Path(cfg.run.run_dir)
    used = [m for m in RUN_MARKERS if (run_dir / m).exists()]
    if used and not resume:
        raise ConfigError(f"run.run_dir: {run_dir} already holds a run ({', '.join(used)}); add --resume to "
                          "continue it, or choose another run.run_dir")
    if resume:
        cfg.learner.resume = True  # the latest checkpoint; the buffer's log and the task positions are read anyway
        log.info("resuming the run in %s" if used else "nothing to resume in %s: starting a new run", run_dir)


def up(cfg: Config, resume: bool = False) -> int:
    """Run until the learner finishes max_steps, the time limit passes, or Ctrl-C/SIGTERM."""
    check_run_dir(cfg, resume)
    started = time.monotonic()
    progress = Progress(cfg.run.rolling_episodes)
    with LocalStack(cfg) as stack:
        log.info("all roles running; logs in %s, launcher metrics on port %d", stack.run_dir / "logs",
                 stack.metrics_port)
        try:
            while time.monotonic() - started < cfg.run.time_limit_s:
                learner = next(c for c in stack.procs.children if c.name == "learner")
                if learner.proc.poll() == 0:
                    return 0
                stack.check_alive()
                progress.update(read_steps(stack.run_dir), time.monotonic() - started)
                time.sleep(1.0)
        except KeyboardInterrupt:
            log.info("interrupted; stopping every role")
        finally:
            progress.close()
    return 0
