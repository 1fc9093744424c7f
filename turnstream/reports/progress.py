"""Live progress of a training run from its learner.jsonl: one rewritten line on a terminal, a periodic log
line otherwise, so CI logs and `nohup` files stay short."""
from __future__ import annotations

import logging
import sys
from typing import TextIO

from turnstream.reports.run_log import rolling_success

log = logging.getLogger("turnstream.reports.progress")


class Progress:
    """One live status line on a terminal; a log line every `interval_s` otherwise (CI logs stay short).

    The line: learner steps, batch and rolling success, trained tokens/s since the first step, the largest
    staleness of the newest batch, elapsed seconds.
    """

    def __init__(self, window_episodes: int, stream: TextIO | None = None, interval_s: float = 15.0,
                 label: str = ""):
        self.window = window_episodes
        self.label = f"{label}: " if label else ""  # which run, when one process runs several (benchmarks)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s
        self._last_log = float("-inf")
        self._width = 0

    def line(self, steps: list[dict], elapsed_s: float) -> str:
        return self.label + self._status(steps, elapsed_s)

    def _status(self, steps: list[dict], elapsed_s: float) -> str:
        if not steps:
            return f"waiting for the first learner step ({elapsed_s:.0f}s)"
        last = steps[-1]
        span = last["time"] - (steps[0]["time"] - steps[0]["wall_s"])
        tokens_s = sum(s.get("tokens", 0) for s in steps) / span if span > 0 else 0.0
        return (f"step {last['version']}  success {last['return_mean']:.3f}  "
                f"rolling {rolling_success(steps, self.window):.3f}  "
                f"episodes {sum(s['episodes'] for s in steps)}  {tokens_s:,.0f} tok/s  "
                f"staleness max {last.get('staleness_max', 0)}  ({elapsed_s:.0f}s)")

    def update(self, steps: list[dict], elapsed_s: float, force: bool = False) -> None:
        text = self.line(steps, elapsed_s)
        if self.tty:
            # \r rewrites the line in place; pad over a longer previous line
            self.stream.write("\r" + text.ljust(self._width))
            self.stream.flush()
            self._width = len(text)
        elif force or elapsed_s - self._last_log >= self.interval_s:
            self._last_log = elapsed_s
            log.info("%s", text)

    def close(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
