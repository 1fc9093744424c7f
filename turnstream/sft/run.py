"""`turnstream sft --config FILE`, and `warm_start`, the same from transcripts in memory.

Each transcript the actors could not have produced is refused with one log line (its line and why) and
counted by reason; the rest train. The command prints one JSON line last:
`{"trained", "refused": {reason: count}, "steps", "loss_start", "loss_end", "output_dir"}`, where the two
losses are the mean loss on the assistant tokens of (up to EVAL_TRANSCRIPTS of) the trained transcripts
before and after training.
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from turnstream.checks.preflight import ensure_model
from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError
from turnstream.learner.scale_defaults import resolve_for_checkpoint
from turnstream.sft.transcripts import Limit, Refused, Rendered, TranscriptRenderer

log = logging.getLogger("turnstream.sft")

EVAL_TRANSCRIPTS = 64  # transcripts loss_start and loss_end are measured on: a bounded cost on any data set


@dataclass
class SftReport:
    output_dir: Path
    trained: int  # transcripts trained on
    refused: dict[str, int]  # reason -> transcripts refused for it
    steps: int
    loss_start: float
    loss_end: float
    losses: list[float] = field(default_factory=list)  # each step's loss, before its update

    def summary(self) -> dict:
        return {"trained": self.trained, "refused": self.refused, "steps": self.steps,
                "loss_start": round(self.loss_start, 4), "loss_end": round(self.loss_end, 4),
                "output_dir": str(self.output_dir)}


def context_limit(cfg: Config) -> Limit:
    """The most tokens a transcript may have: what the actors' context holds (vllm.max_model_len, at most the
    model's positions) and, under a budget, what one micro-batch holds (the budget the trainer resolves "auto" to,
    read from the checkpoint's size before it is loaded)."""
    limits = [Limit(cfg.vllm.max_model_len, "vllm.max_model_len")]
    try:
        positions = json.loads((Path(cfg.model.path) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        positions = None
    if isinstance(positions, int) and positions > 0:
        limits.append(Limit(positions, "the model's max_position_embeddings"))
    budget = cfg.learner.max_tokens_per_microbatch
    if budget == "auto":
        budget = resolve_for_checkpoint(cfg.learner, cfg.model.path).max_tokens_per_microbatch
    if budget:
        limits.append(Limit(budget, "learner.max_tokens_per_microbatch"))
    return min(limits, key=lambda limit: limit.tokens)


def render_all(transcripts: Iterable[str | dict], renderer: TranscriptRenderer) -> tuple[list[Rendered], Counter]:
    """The trainable transcripts, and the refused ones counted by reason (each logged once, with its line).
    A string is a JSON line (a blank one is skipped), anything else a parsed transcript."""
    kept, refused = [], Counter()
    for line, item in enumerate(transcripts, 1):
        if isinstance(item, str) and not item.strip():
            continue
        try:
            kept.append(renderer.render_line(line, item) if isinstance(item, str) else renderer.render(line, item))
        except Refused as exc:
            refused[exc.reason] += 1
            log.warning("line %d: refused (%s): %s", line, exc.reason, exc)
    return kept, refused


def warm_start(transcripts: Iterable[str | dict], cfg: Config, output_dir: str | Path | None = None) -> SftReport:
    """Train cfg.model.path on `transcripts` (JSON lines or parsed {"messages": [...]} objects) as `cfg.sft` and
    `cfg.learner` say; write the result to `output_dir` (default: sft.output_dir, or <run_dir>/sft)."""
    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.learner.device import set_torch_threads
    from turnstream.sft.train import SftTrainer, require_empty

    out = Path(output_dir or cfg.sft.output_dir or cfg.run_dir / "sft")
    require_empty(out)
    set_torch_threads(cfg.learner)
    renderer = TranscriptRenderer(ChatTokens(cfg.model.path), context_limit(cfg))
    items, refused = render_all(transcripts, renderer)
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(refused.items())) or "none"
    if not items:
        raise ConfigError(f"sft.transcripts: no transcript can be trained (refused: {reasons})")
    trainer = SftTrainer(cfg.model.path, cfg.sft, cfg.learner, seed=cfg.run.seed)
    sample = items[:EVAL_TRANSCRIPTS]
    loss_start = trainer.mean_loss(sample)
    progress = trainer.train(items)
    report = SftReport(out, len(items), dict(sorted(refused.items())), progress.steps, loss_start,
                       trainer.mean_loss(sample), progress.losses)
    trainer.save(out)
    log.info("trained on %d transcripts in %d steps (refused %d: %s); loss %.4f -> %.4f; wrote %s", report.trained,
             report.steps, sum(refused.values()), reasons, report.loss_start, report.loss_end, out)
    return report


def main(cfg: Config) -> int:
    path = Path(cfg.sft.transcripts)
    if not cfg.sft.transcripts:
        raise ConfigError("sft.transcripts: required: a JSON lines file of chat transcripts")
    if not path.is_file():
        raise ConfigError(f"sft.transcripts: {path} is not a file")
    ensure_model(cfg.model.path, "model.path", cfg.model.tiny_seed)  # the default tiny model is built if missing
    with path.open(encoding="utf-8", errors="replace") as lines:
        report = warm_start(lines, cfg)
    print(json.dumps(report.summary()))
    return 0
