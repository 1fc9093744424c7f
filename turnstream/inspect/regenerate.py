"""`turnstream regenerate RUN_DIR --episode ID`: sample a recorded episode's turns again, token for token.

Each turn's request is sent again as the actor sent it (its context tokens, temperature, allowed tokens, top-p,
top-k and sampling seed, and as many tokens as it sampled) to a vLLM server holding the weights of the version that
sampled it, and the tokens are compared. A turn a weight push landed in the middle of was sampled by two versions,
the later tokens attending to the earlier ones' cache: its first version's tokens are compared. vLLM samples a
seeded request from its own random stream, independent of the requests batched with it, so a turn comes out the
same unless the server's numerics differ (another build, another device, another dtype: docs/reproduce.md).

Prints a line per turn, then one JSON line; exits 1 when a compared turn differs, and 3 when no turn could be
sampled again (turnstream/replay/verdict.py): a turn not sampled again is never counted as equal.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from turnstream.core.config import Config
from turnstream.core.configtools import ConfigError
from turnstream.inspect.episodes import RecordedTurn, items
from turnstream.inspect.weights import VersionWeights, kept_weights, replayed_weights
from turnstream.replay.verdict import exit_status, nothing_compared

log = logging.getLogger("turnstream.inspect")
CONCURRENT_REQUESTS = 16


@dataclass
class Outcome:
    """One turn regenerated, or why not."""

    turn: RecordedTurn
    version: int  # the version of its first tokens
    compared: int  # how many of its tokens were sampled by that version (all, unless a push landed mid-turn)
    status: str  # equal, differs, unseeded or no_weights
    tokens: list[int] | None = None  # what the server sampled
    max_logprob_diff: float | None = None  # over the tokens up to the first difference

    @property
    def first_difference(self) -> int | None:
        if self.tokens is None:
            return None
        recorded = self.turn.tokens[:self.compared].tolist()
        return next((i for i, (a, b) in enumerate(zip(recorded, self.tokens)) if a != b),
                    None if len(recorded) == len(self.tokens) else min(len(recorded), len(self.tokens)))

    def line(self) -> str:
        t = self.turn
        head = f"turn {t.turn}: version {self.version}, seed {t.seed}, {self.compared} tokens"
        if self.compared < t.tokens.size:
            head += f" of {t.tokens.size} (a push landed mid-turn; the rest came from versions " \
                    f"{sorted(set(t.versions[self.compared:].tolist()))})"
        if self.status == "equal":
            return f"{head}: equal (log-probs within {self.max_logprob_diff:.2g})"
        if self.status == "differs":
            return f"{head}: DIFFERS from token {self.first_difference} (log-probs within " \
                   f"{self.max_logprob_diff:.2g} before it)"
        if self.status == "unseeded":
            return f"{head}: not regenerated: its request carried no seed (an actor from before seeds)"
        return f"{head}: not regenerated: the weights of version {self.version} are not kept"


def episode_turns(record, episode_id: str, step: int | None = None) -> list[RecordedTurn]:
    """The episode's trained turns across the steps that trained them (or in step `step`), each turn once: a
    segment's bootstrap turn (its first token only) gives way to the turn's whole recording."""
    steps = [record.step(step)] if step is not None else list(record.steps())
    found: dict[int, RecordedTurn] = {}
    for recorded in steps:
        if recorded.lost:
            continue
        for item in items(recorded.batch):
            if item.episode_id != episode_id:
                continue
            for turn in item.turns:
                known = found.get(turn.turn)
                if known is None or (turn.complete and not known.complete):
                    found[turn.turn] = turn
    if not found:
        where = f"step {step}" if step is not None else f"the record's {record.describe_range()}"
        raise ConfigError(f"regenerate --episode: no episode {episode_id!r} was trained in {where}")
    return [found[t] for t in sorted(found)]


def planned(turns: list[RecordedTurn]) -> list[Outcome]:
    out = []
    for turn in turns:
        version, _, end = turn.version_spans()[0]
        out.append(Outcome(turn, version, end, "unseeded" if turn.seed < 0 else "pending"))
    return out


def weights_for(cfg: Config, run_dir: Path, versions: list[int], replay: bool, scratch: Path,
                overrides: list[str] | None) -> dict[int, VersionWeights]:
    found = {v: w for v in versions if (w := kept_weights(cfg, run_dir, v)) is not None}
    missing = [v for v in versions if v not in found]
    if missing and replay:
        found.update(replayed_weights(run_dir, missing, scratch, overrides))
    return found


async def sample_again(url: str, outcomes: list[Outcome], weights: dict[int, VersionWeights], model_dir: str) -> None:
    """Per version (in order): its weights into the server, then its turns' requests, a few at a time."""
    import aiohttp

    from turnstream.actors.inference.client import post_generate
    from turnstream.learner.sync.disk import DiskWeightSync

    with tempfile.TemporaryDirectory() as unused:  # pushes of kept directories write nothing here
        sync = DiskWeightSync([url], unused, model_dir)
        gate = asyncio.Semaphore(CONCURRENT_REQUESTS)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            for version in sorted({o.version for o in outcomes if o.status == "pending"}):
                if version not in weights:
                    for o in outcomes:
                        if o.version == version and o.status == "pending":
                            o.status = "no_weights"
                    continue
                await sync.push(weights[version].path, version)

                async def one(o: Outcome) -> None:
                    t = o.turn
                    async with gate:
                        # a cache salt of its own: no prefix computed under other weights is reused
                        gen = await post_generate(session, url, t.context.tolist(), max_tokens=o.compared,
                                                  temperature=t.temperature, allowed_token_ids=list(t.allowed) or None,
                                                  cache_salt=f"regenerate-v{version}", top_p=t.top_p, top_k=t.top_k,
                                                  seed=t.seed)
                    o.tokens = gen.tokens
                    same = o.first_difference
                    upto = o.compared if same is None else same
                    diffs = np.abs(np.asarray(gen.logprobs[:upto]) - t.logprobs[:upto])
                    o.max_logprob_diff = float(diffs.max()) if diffs.size else 0.0
                    o.status = "equal" if same is None else "differs"

                await asyncio.gather(*(one(o) for o in outcomes if o.version == version and o.status == "pending"))


def regenerate(run_dir: str | Path, episode_id: str, *, step: int | None = None, url: str | None = None,
               replay: bool = True, overrides: list[str] | None = None) -> list[Outcome]:
    from turnstream.learner.record.reader import open_record

    run_dir = Path(run_dir)
    record = open_record(run_dir)
    cfg = record.incarnations[-1].config(overrides)
    if cfg.learner.lora is not None:
        raise ConfigError("regenerate: learner.lora runs are not supported (their versions are adapters)")
    outcomes = planned(episode_turns(record, episode_id, step))
    versions = sorted({o.version for o in outcomes if o.status == "pending"})
    with tempfile.TemporaryDirectory(prefix="turnstream-regenerate-") as scratch:
        weights = weights_for(cfg, run_dir, versions, replay, Path(scratch), overrides)
        for v in versions:
            w = weights.get(v)
            log.info("version %d: %s", v, f"{w.source} {w.path}" if w else "weights not kept")
        if not any(v in weights for v in versions):
            return [_no_weights(o) for o in outcomes]
        if url:
            asyncio.run(sample_again(url.rstrip("/"), outcomes, weights, cfg.model.path))
        else:
            with local_vllm(cfg, Path(scratch)) as started:
                asyncio.run(sample_again(started, outcomes, weights, cfg.model.path))
    return outcomes


def _no_weights(o: Outcome) -> Outcome:
    if o.status == "pending":
        o.status = "no_weights"
    return o


@contextlib.contextmanager
def local_vllm(cfg: Config, log_dir: Path) -> Iterator[str]:
    """A vLLM server of the run's model with the run's [vllm] settings on a free local port, for the duration;
    yields its URL."""
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    procs = ProcessGroup(log_dir)
    try:
        yield start_vllm_server(procs, cfg.model.path, cfg.vllm, timeout_s=600)
    finally:
        procs.stop_all()


def main(run_dir: str, episode_id: str, step: int | None, url: str | None, replay: bool,
         overrides: list[str]) -> int:
    outcomes = regenerate(run_dir, episode_id, step=step, url=url, replay=replay, overrides=overrides)
    print(f"episode {episode_id}: {len(outcomes)} trained turns")
    for o in outcomes:
        print("  " + o.line())
    counts = {s: sum(o.status == s for o in outcomes) for s in ("equal", "differs", "unseeded", "no_weights")}
    compared = counts["equal"] + counts["differs"]
    if not compared:
        print(nothing_compared(f"no turn of episode {episode_id} could be sampled again"))
    print(json.dumps({"episode": episode_id, "turns": len(outcomes), "compared": compared, **counts,
                      "differing_turns": [o.turn.turn for o in outcomes if o.status == "differs"],
                      "versions": sorted({o.version for o in outcomes})}))
    return exit_status(compared, differs=bool(counts["differs"]))
