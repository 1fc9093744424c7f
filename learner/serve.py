"""Rank 0 of the learner: batches in from the buffer, each trained version out to the vLLM servers (weight
sync), then to the buffer and actors (a version announcement on the PUB). The loop tells its helpers (the
record, the audit, the periodic checkpoints, the metrics, the step's log line, the trackers) what happened
through typed events (learner/events.py), and runs under the role's lifecycle beside its background tasks
(protocol/role_process.py): one that fails stops the learner with its error."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.asyncio

from turnstream.core.config import Config
from turnstream.core.urls_file import watch_urls_file
from turnstream.learner.batch_client import BatchClient
from turnstream.learner.checkpoint.layout import latest, version_of
from turnstream.learner.device import served_dtype
from turnstream.learner.metrics import LearnerMetrics
from turnstream.learner.parallel.ranks import broadcast
from turnstream.learner.events import LearnerStopped, Listeners, StepTrained, VersionPublished, VersionSaved
from turnstream.learner.listeners import listeners_for, save_checkpoint
from turnstream.learner.record.writer import generator_state
from turnstream.learner.rank_commands import probe_logprobs, push_source
from turnstream.learner.sync.base import WeightSync, WeightSyncError
from turnstream.learner.sync.factory import verifier_from_config, weight_sync_from_config
from turnstream.learner.sync.verify import Expected
from turnstream.learner.trackers import open_trackers
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
    """The learner's sockets: version PUB, buffer client; `refusals` counts refused subscribers (CURVE), a
    background task of the role's (RoleProcess.run stops it)."""
    ctx: zmq.asyncio.Context
    pub: zmq.asyncio.Socket
    batches: BatchClient
    authenticator: object | None  # CURVE: only allow-listed subscribers hear the versions
    refusals: asyncio.Task | None

    async def close(self) -> None:
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
            refusal_monitor(pub), refusal_counter(metrics.auth_failures, "pub", log)), name="refusal counter")
    pub.bind(bind_address(net.listen_host, net.learner_pub_port))
    batches = BatchClient(ctx, bind_address(net.buffer_address, net.buffer_serve_port), net.max_message_bytes, curve)
    return Endpoints(ctx, pub, batches, authenticator, refusals)


def background_tasks(cfg: Config, sync: WeightSync, endpoints: Endpoints) -> list[asyncio.Task]:
    """What runs beside the loop for as long as it does: the weight-sync watcher (re-syncs servers that missed a
    push once they answer again), the servers' list file, the refusal counter."""
    tasks = [asyncio.create_task(sync.watch(), name="weight-sync watcher")]
    if cfg.vllm.urls_file:
        tasks.append(asyncio.create_task(watch_urls_file(Path(cfg.vllm.urls_file), sync.set_urls,
                                                         cfg.vllm.health_interval_s), name="vllm.urls_file watcher"))
    if endpoints.refusals is not None:
        tasks.append(endpoints.refusals)
    return tasks


@dataclass
class Publisher:
    """Each trained version, in order: pushed into the servers, then announced, then heard by the listeners
    (VersionPublished: the step's metrics, log line, trackers). With `overlap` the push runs while the next step
    trains; there is still only one push at a time."""
    sync: WeightSync
    pub: zmq.asyncio.Socket
    metrics: LearnerMetrics
    listeners: Listeners
    started: float
    overlap: bool
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
        await self.listeners.emit(VersionPublished(version, stats))


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
    """`resumed_from`: the checkpoint the trainer was restored from, named in the record's start file. The loop
    runs under the role's lifecycle beside its background tasks: a background task that fails stops the loop
    as SIGTERM would, and its error is raised."""
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
        listeners = listeners_for(cfg, trainer, world, resumed_from, metrics, trackers)
        endpoints = open_endpoints(cfg, metrics)
        try:
            loop = asyncio.create_task(train_and_publish(cfg, trainer, world, sync, push_dtype, metrics, endpoints,
                                                         listeners, role.stop), name="learner loop")
            await role.run(loop, background_tasks(cfg, sync, endpoints))
        finally:
            await endpoints.close()


async def train_and_publish(cfg: Config, trainer: Trainer, world: int, sync: WeightSync, push_dtype,
                            metrics: LearnerMetrics, endpoints: Endpoints, listeners: Listeners,
                            stop: asyncio.Event) -> None:
    """Batch in, step, push and announce, until stopped or at learner.max_steps; then checkpoint and release
    the other ranks. Each step is told to the `listeners` (learner/events.py): StepTrained once trained,
    VersionSaved once its weights are saved and before its push, VersionPublished once announced; LearnerStopped
    last."""
    lc = cfg.learner
    await endpoints.pub.send_multipart(encode(VersionAnnouncement(trainer.version)))
    publisher = Publisher(sync, endpoints.pub, metrics, listeners, time.monotonic(),
                          push_overlaps_training(cfg, trainer.parallel.collective_push))
    log.info("weight pushes %s the next step", "overlap" if publisher.overlap else "precede")
    try:
        while not stop.is_set() and not (lc.max_steps and trainer.version >= lc.max_steps):
            waited = time.monotonic()
            batch = await next_batch(endpoints.batches, cfg, trainer.version, stop)
            if batch is None:
                continue
            wait_s = time.monotonic() - waited
            step_started = time.time()
            generator_before = generator_state(trainer.generator)
            stats = await train_on(trainer, batch, world, metrics)
            if stats is None:
                continue
            await listeners.emit(StepTrained(trainer.version, batch, stats, generator_before))
            # disk: the weights are gathered and written here; nccl: gathered as the push broadcasts them
            path = await asyncio.to_thread(sync.save, push_source(cfg, trainer, push_dtype), trainer.version)
            expected = await expected_of(sync, trainer, push_dtype)  # before the next step changes the weights
            stats.update(await listeners.emit(VersionSaved(trainer.version)))
            stats.update(wait_s=wait_s, step_started=step_started)
            await publisher.submit(path, trainer.version, stats, changed_values(trainer, batch), expected)
        await publisher.drain()
        await checkpoint_on_stop(cfg, trainer)  # before the other ranks are released: they write their shards
    finally:
        await publisher.drain()  # the last version still reaches the servers and the buffer
        broadcast(None, 0, world)  # release the other ranks
        await listeners.emit(LearnerStopped(trainer.version))


async def expected_of(sync: WeightSync, trainer: Trainer, dtype) -> Expected | None:
    """What the servers must serve after the push of the trainer's current weights, where that push is verified
    (vllm.weight_sync.verify_every): the policy's log-probs of the verification probe."""
    verifier = sync.verifier
    if verifier is None or not verifier.due(trainer.version):
        return None
    return verifier.expect(trainer.version,
                           await asyncio.to_thread(probe_logprobs, trainer, verifier.tokens, dtype))


def changed_values(trainer: Trainer, batch: Batch) -> dict[str, float]:
    """The per-prompt values of the batch's prompts that this step changed (SPO's tracker; none for the estimators
    that keep none), which the actors' curriculum reads."""
    return trainer.estimator.changed_values(batch.prompt_keys)


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


async def checkpoint_on_stop(cfg: Config, trainer: Trainer) -> None:
    """A stopped learner (SIGTERM, max_steps) leaves a checkpoint of its last step, so that a resumed run
    loses no step: this runs only after that step's push and announcement."""
    root = Path(cfg.run.run_dir) / "checkpoints"
    if trainer.version > 0 and version_of(latest(root)) < trainer.version:
        seconds = await save_checkpoint(cfg, trainer)
        log.info("checkpoint of version %d on stop (%.1f s)", trainer.version, seconds)
