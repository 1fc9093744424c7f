"""Rank 0 of the learner: batches in from the buffer, each trained version out to the vLLM servers (weight
sync), then to the buffer and actors (a version announcement on the PUB), then into the step's log line."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import zmq
import zmq.asyncio

from turnstream.core.audit import open_audit
from turnstream.core.config import Config
from turnstream.core.urls_file import watch_urls_file
from turnstream.learner.batch_client import BatchClient
from turnstream.learner.checkpoint.layout import latest, version_of
from turnstream.learner.device import served_dtype
from turnstream.learner.metrics import LearnerMetrics
from turnstream.learner.parallel.ranks import broadcast
from turnstream.learner.record.writer import StepRecorder, generator_state
from turnstream.learner.rank_commands import probe_logprobs, push_source, save_checkpoint as write_checkpoint
from turnstream.learner.sync.base import WeightSync, WeightSyncError
from turnstream.learner.sync.factory import verifier_from_config, weight_sync_from_config
from turnstream.learner.sync.verify import Expected
from turnstream.learner.trackers import Trackers, open_trackers
from turnstream.learner.step.trainer import NothingToTrain, Trainer
from turnstream.protocol.auth import (count_refusals, keys_for, make_server, refusal_counter, refusal_monitor,
                                      start_authenticator)
from turnstream.protocol.codec import encode
from turnstream.protocol.messages import Batch, VersionAnnouncement
from turnstream.protocol.role_process import RoleProcess
from turnstream.protocol.sockets import bind_address, configure

log = logging.getLogger("turnstream.learner")


@dataclass
class Endpoints:
    """The learner's sockets: version PUB, buffer client."""
    ctx: zmq.asyncio.Context
    pub: zmq.asyncio.Socket
    batches: BatchClient
    authenticator: object | None  # CURVE: only allow-listed subscribers hear the versions
    refusals: asyncio.Task | None

    async def close(self) -> None:
        if self.refusals is not None:
            self.refusals.cancel()
        if self.authenticator is not None:
            self.authenticator.stop()
        self.ctx.destroy(linger=0)


def open_endpoints(cfg: Config, metrics: LearnerMetrics) -> Endpoints:
    net = cfg.network
    ctx = zmq.asyncio.Context()
    curve = keys_for(net)
    pub = configure(ctx.socket(zmq.PUB), max_bytes=net.max_message_bytes)
    authenticator, refusals = None, None
    if curve is not None:  # the PUB is a server
        authenticator = start_authenticator(ctx, curve)
        make_server(pub, curve)
        # refused subscribers are counted (and logged sparingly), as the buffer counts refused peers
        refusals = asyncio.create_task(count_refusals(
            refusal_monitor(pub), refusal_counter(metrics.auth_failures, "pub", log)))
    pub.bind(bind_address(net.listen_host, net.learner_pub_port))
    batches = BatchClient(ctx, bind_address(net.buffer_address, net.buffer_serve_port), net.max_message_bytes, curve)
    return Endpoints(ctx, pub, batches, authenticator, refusals)


@dataclass
class Publisher:
    """Each trained version, in order: pushed into the servers, then announced, then its line logged. With
    `overlap` the push runs while the next step trains; there is still only one push at a time."""
    sync: WeightSync
    pub: zmq.asyncio.Socket
    metrics: LearnerMetrics
    log_file: TextIO
    started: float
    overlap: bool
    trackers: Trackers  # [logging] trackers: TensorBoard, W&B
    publishing: asyncio.Task | None = None

    async def submit(self, path, version: int, stats: dict, values: dict[str, float],
                     expected: Expected | None = None) -> None:
        """`values`: the SPO tracker values this step changed, announced with the version; `expected`: what the
        servers must serve once the push verifies (None: not verified)."""
        await self.drain()
        self.publishing = asyncio.create_task(self._publish(path, version, stats, values, expected))
        if not self.overlap:
            await self.publishing

    async def drain(self) -> None:
        if self.publishing is not None:
            await self.publishing

    async def _publish(self, path, version: int, stats: dict, values: dict[str, float],
                       expected: Expected | None) -> None:
        push_started = time.time()
        try:
            push_s = await self.sync.push(path, version, expected)
        except WeightSyncError as exc:
            # Servers keep generating with older weights; their tokens carry the older version, so the
            # staleness bound still holds. The next push carries everything learned so far.
            self.metrics.push_failures.inc()
            log.error("weight push of version %d failed: %s", version, exc)
            push_s = float("nan")
        # announced only once the servers hold it: a version label always names the weights that sampled
        await self.pub.send_multipart(encode(VersionAnnouncement(version, str(path), prompt_keys=list(values),
                                                                 prompt_values=list(values.values()))))
        # push_started and step_started (wall clock) show in the log whether a push overlapped the next step
        stats.update(push_s=push_s, push_started=push_started, wall_s=time.monotonic() - self.started, time=time.time())
        self.metrics.record(stats)
        self.metrics.wait_seconds.observe(stats["wait_s"])
        if push_s == push_s:  # not NaN
            self.metrics.push_seconds.observe(push_s)
        self.log_file.write(json.dumps(stats) + "\n")
        self.log_file.flush()
        self.trackers.step(stats)
        log.info("step %d: return %.3f, loss %.4f, staleness max %d, step %.2fs, push %.2fs, wait %.2fs",
                 stats["version"], stats["return_mean"], stats["policy_loss"], stats["staleness_max"],
                 stats["step_s"], push_s, stats["wait_s"])


def push_overlaps_training(cfg: Config, collective_push: bool = False) -> bool:
    """Whether a version's push runs while the next step trains (learner.overlap_push).

    Safe only when the push reads a snapshot (the disk backend's saved file; nccl broadcasts the live
    parameters, which the next step changes), and only in asynchronous mode: with eta = 0 the synchronous
    baseline is generate, train, push, repeat, and every episode of a batch must come from the newest weights.
    A sharded learner's nccl push gathers as it broadcasts (`collective_push`), collectives that must not
    interleave with a step's."""
    if collective_push and cfg.vllm.weight_sync.backend == "nccl":
        return False
    if cfg.learner.overlap_push == "auto":
        return cfg.vllm.weight_sync.backend == "disk" and cfg.buffer.eta >= 1
    return bool(cfg.learner.overlap_push)


async def serve(cfg: Config, trainer: Trainer, world: int, resumed_from: Path | None = None) -> None:
    """`resumed_from`: the checkpoint the trainer was restored from, named in the record's start file."""
    lc, run_dir = cfg.learner, Path(cfg.run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    trackers = open_trackers(cfg)  # first: a missing tracker package exits before any push
    metrics = LearnerMetrics()
    push_dtype = served_dtype(cfg.vllm.dtype, cfg.model.path)  # master weights stay fp32; pushes are cast
    sync = weight_sync_from_config(cfg, run_dir / "weights",
                                   verifier_from_config(cfg, trainer.vocab_size, push_dtype, metrics))
    # The servers may hold other weights (a checkpoint we resumed past, an earlier run on a shared server):
    # give them ours before announcing, so version labels always name the weights that sampled.
    try:
        path = await asyncio.to_thread(sync.save, push_source(cfg, trainer, push_dtype), trainer.version)
        await sync.push(path, trainer.version, await expected_of(sync, trainer, push_dtype))
    except WeightSyncError as exc:
        metrics.push_failures.inc()
        log.error("initial push of version %d failed: %s", trainer.version, exc)
    metrics.version.set(trainer.version)
    async with RoleProcess(metrics.registry, cfg.network.listen_host, lc.metrics_port,
                           health=lambda: {"version": trainer.version}) as role:
        log.info("learner: metrics port %d, %d vLLM server(s), %d rank(s), estimator %s", role.metrics_port,
                 len(cfg.vllm.urls), world, lc.estimator)
        recorder = StepRecorder.start(cfg, trainer.version, world, resumed_from) if lc.record else None
        await train_and_publish(cfg, trainer, world, sync, push_dtype, metrics, trackers, role.stop, recorder)


async def train_and_publish(cfg: Config, trainer: Trainer, world: int, sync, push_dtype, metrics: LearnerMetrics,
                            trackers: Trackers, stop: asyncio.Event, recorder: StepRecorder | None = None) -> None:
    """Batch in, step, push and announce, until stopped or at learner.max_steps; then checkpoint and release
    the other ranks. With a `recorder` (learner.record), each step's record is written while its weights are
    saved, and is durable before the version is checkpointed, pushed or logged (learner/record/format.py)."""
    lc, run_dir = cfg.learner, Path(cfg.run.run_dir)
    endpoints = open_endpoints(cfg, metrics)
    await endpoints.pub.send_multipart(encode(VersionAnnouncement(trainer.version)))
    audit = open_audit(run_dir, "learner")  # None unless TURNSTREAM_AUDIT=1 (tests/fault/)
    background = [asyncio.create_task(sync.watch())]  # re-syncs servers that missed a push once they answer again
    if cfg.vllm.urls_file:
        background.append(asyncio.create_task(watch_urls_file(Path(cfg.vllm.urls_file), sync.set_urls,
                                                              cfg.vllm.health_interval_s)))
    publisher = Publisher(sync, endpoints.pub, metrics, (run_dir / "learner.jsonl").open("a"), time.monotonic(),
                          push_overlaps_training(cfg, trainer.parallel.collective_push), trackers)
    log.info("weight pushes %s the next step", "overlap" if publisher.overlap else "precede")
    try:
        while not stop.is_set() and not (lc.max_steps and trainer.version >= lc.max_steps):
            waited = time.monotonic()
            batch = await next_batch(endpoints.batches, cfg, trainer.version, stop)
            if batch is None:
                continue
            wait_s = time.monotonic() - waited
            step_started = time.time()
            rng_before = generator_state(trainer.generator) if recorder is not None else b""
            stats = await train_on(trainer, batch, world, metrics)
            if stats is None:
                continue
            recording = None
            if recorder is not None:  # written while the weights are saved; awaited before the version shows
                recording = asyncio.create_task(asyncio.to_thread(recorder.write_step, trainer.version, batch,
                                                                  rng_before, stats["step_s"]))
            if audit is not None:  # before the checkpoint, so a checkpointed step always has its line
                audit.write({"version": trainer.version, "batch_version": batch.learner_version,
                             "episodes": list(batch.episode_ids), "prompt_keys": list(batch.prompt_keys),
                             "tokens": [int(n) for n in batch.episode_offsets[1:] - batch.episode_offsets[:-1]],
                             "staleness_max": stats["staleness_max"]})
            # disk: the weights are gathered and written here; nccl: gathered as the push broadcasts them
            path = await asyncio.to_thread(sync.save, push_source(cfg, trainer, push_dtype), trainer.version)
            expected = await expected_of(sync, trainer, push_dtype)  # before the next step changes the weights
            if recording is not None:  # record_wait_s: what recording adds to the step's critical path
                waited_record = time.monotonic()
                written = await recording
                stats.update(record_bytes=written.bytes, record_s=written.seconds,
                             record_wait_s=time.monotonic() - waited_record)
            if lc.checkpoint_every and trainer.version % lc.checkpoint_every == 0:
                stats["checkpoint_s"] = await save_checkpoint(cfg, trainer)
            stats.update(wait_s=wait_s, step_started=step_started)
            await publisher.submit(path, trainer.version, stats, changed_values(trainer, batch), expected)
        await publisher.drain()
        await checkpoint_on_stop(cfg, trainer)  # before the other ranks are released: they write their shards
    finally:
        await publisher.drain()  # the last version still reaches the servers and the buffer
        for task in background:
            task.cancel()
        broadcast(None, 0, world)  # release the other ranks
        publisher.log_file.close()
        trackers.close()
        if audit is not None:
            audit.close()
        await endpoints.close()


async def expected_of(sync: WeightSync, trainer: Trainer, dtype) -> Expected | None:
    """What the servers must serve after the push of the trainer's current weights, where that push is verified
    (vllm.weight_sync.verify_every): the policy's log-probs of the verification probe."""
    verifier = sync.verifier
    if verifier is None or not verifier.due(trainer.version):
        return None
    return verifier.expect(trainer.version,
                           await asyncio.to_thread(probe_logprobs, trainer, verifier.tokens, dtype))


def changed_values(trainer: Trainer, batch: Batch) -> dict[str, float]:
    """The SPO tracker's values of the batch's prompts, which this step folded in (none for other estimators)."""
    if trainer.cfg.estimator != "spo":
        return {}
    return {key: trainer.tracker.value(key) for key in dict.fromkeys(batch.prompt_keys)}


# A batch request is a long poll of this many seconds. The buffer counts a batch consumed once it sends it, so a
# stopping learner lets the request in flight finish (at most this long, plus the grace for a buffer that is gone)
# and trains what it brings, instead of dropping a batch that nobody would ever train.
POLL_S = 2.0
STOP_GRACE_S = 3.0


async def next_batch(batches: BatchClient, cfg: Config, version: int, stop: asyncio.Event) -> Batch | None:
    """The buffer's next batch for the policy `version`; None once stopped with no batch in flight."""
    while True:
        fetch = asyncio.create_task(batches.get(version, cfg.buffer.batch_episodes, cfg.learner.batch_max_tokens,
                                                poll_s=POLL_S))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([fetch, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not fetch.done():
            try:
                await asyncio.wait_for(fetch, POLL_S + STOP_GRACE_S)
            except TimeoutError:  # no answer within the poll and its grace: the buffer is gone or stalled
                log.info("stopped with no answer to the batch request in flight")
                return None
        batch = fetch.result()
        if getattr(batch, "status", "ok") == "ok" and batch.episode_ids:
            if stop.is_set():
                log.info("stopped with a batch in flight: training its %d episode(s) first", len(batch.episode_ids))
            return batch
        if stop.is_set():
            return None


async def train_on(trainer: Trainer, batch: Batch, world: int, metrics: LearnerMetrics) -> dict | None:
    """One step on every rank (rank 0 hands the batch over first); None for a batch the model cannot take."""
    try:
        return await asyncio.to_thread(trainer.step, broadcast(batch, 0, world))
    except NothingToTrain as exc:  # every episode dropped: counted, the learner keeps serving
        metrics.over_budget.inc(exc.over_budget)
        metrics.bad_tokens.inc(exc.bad_tokens)
        metrics.rejected_batches.inc()
        log.error("skipped a batch: %s", exc)
    except ValueError as exc:  # a batch the model cannot take (e.g. an episode that starts with an action)
        metrics.rejected_batches.inc()
        log.error("skipped a batch: %s", exc)
    return None


async def save_checkpoint(cfg: Config, trainer: Trainer) -> float:
    """A checkpoint of the current version (learner/rank_commands.py picks the format); returns its seconds."""
    started = time.monotonic()
    await asyncio.to_thread(write_checkpoint, cfg, trainer)
    return time.monotonic() - started


async def checkpoint_on_stop(cfg: Config, trainer: Trainer) -> None:
    """A stopped learner (SIGTERM, max_steps) leaves a checkpoint of its last step, so that a resumed run
    loses no step: this runs only after that step's push and announcement."""
    root = Path(cfg.run.run_dir) / "checkpoints"
    if trainer.version > 0 and version_of(latest(root)) < trainer.version:
        seconds = await save_checkpoint(cfg, trainer)
        log.info("checkpoint of version %d on stop (%.1f s)", trainer.version, seconds)
