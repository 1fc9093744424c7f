"""`turnstream learner`: request batches, train, push weights, announce versions."""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import time
from pathlib import Path

from turnstream.core.config import Config
from turnstream.core.urls_file import watch_urls_file

log = logging.getLogger("turnstream.learner")


class BatchClient:
    """DEALER to the buffer's serve socket; re-asks after a timeout (the buffer keeps one request per peer).

    The routing id is fixed for the life of the process: after a reconnect (a stall past the heartbeat
    timeout drops the connection and any answer queued on it) the buffer still knows this learner, and
    answers the re-asked request id with the batch it already took for it instead of a fresh one.
    """

    def __init__(self, ctx, addr: str, max_message_bytes: int, curve=None):
        import uuid

        import zmq

        from turnstream.protocol.auth import make_client
        from turnstream.protocol.sockets import configure

        self.sock = configure(ctx.socket(zmq.DEALER), max_bytes=max_message_bytes)
        self.sock.setsockopt(zmq.ROUTING_ID, b"learner-" + uuid.uuid4().hex.encode())
        if curve is not None:  # protocol.auth.CurveKeys
            make_client(self.sock, curve)
        self.sock.connect(addr)
        self.max_message_bytes = max_message_bytes
        self.ids = itertools.count(1)

    async def get(self, version: int, episodes: int, max_tokens: int = 0, retry_s: float = 5.0):
        import zmq

        from turnstream.protocol.codec import DecodeError, decode, encode
        from turnstream.protocol.messages import Batch, BatchRequest

        request_id = next(self.ids)
        while True:
            await self.sock.send_multipart(encode(BatchRequest(request_id, version, episodes, max_tokens)))
            # wait out retry_s for our answer; a stray message (an earlier answer sent twice) is skipped
            deadline = time.monotonic() + retry_s
            while (left := deadline - time.monotonic()) > 0 and await self.sock.poll(left * 1000, zmq.POLLIN):
                frames = await self.sock.recv_multipart(copy=False)
                try:
                    msg = decode(frames, self.max_message_bytes)
                except DecodeError as exc:
                    log.error("undecodable batch: %s", exc)
                    continue
                if isinstance(msg, Batch) and msg.request_id == request_id:
                    return msg


def build_trainer(cfg: Config):
    """Model, optional reference model and critic, Trainer; resumed from the latest checkpoint if asked."""
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.learner import checkpoint
    from turnstream.learner.device import attn_implementation, placement
    from turnstream.learner.trainer import Trainer

    lc = cfg.learner
    where = placement(lc.device, lc.precision)
    resume_from = checkpoint.latest(Path(cfg.run.run_dir) / "checkpoints") if lc.resume else None
    model_dir = resume_from / "model" if resume_from else cfg.model.path
    attn = attn_implementation(lc.attn_implementation, where.device)
    kw = {"attn_implementation": attn} if attn else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kw)
    ref = None
    if lc.kl_coef > 0:  # the KL anchors to the initial policy, also after a resume
        # frozen and never stepped: held in the compute dtype (bf16 on cuda), half the memory of fp32
        ref = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=where.compute_dtype or torch.float32,
                                                   **kw).eval()
        ref.requires_grad_(False)
    trainer = Trainer(model, lc, seed=cfg.run.seed, critic_path=lc.critic.path or cfg.model.path, ref_model=ref,
                      where=where)
    log.info("learner on %s, %s, attention %s, activation checkpointing %s", where.device, where.precision,
             model.config._attn_implementation, lc.activation_checkpointing)
    if resume_from:
        trainer.load_state_dict(*checkpoint.load(resume_from))
        log.info("resumed from %s at version %d", resume_from, trainer.version)
    return model, trainer, resume_from


async def train(cfg: Config) -> None:
    import torch

    from turnstream.learner.distributed import broadcast, init_from_env, shutdown

    lc = cfg.learner
    torch.set_num_threads(lc.torch_threads)
    torch.manual_seed(cfg.run.seed)
    rank, world = init_from_env(lc.device)
    model, trainer, _ = build_trainer(cfg)
    try:
        if rank == 0:
            await _serve(cfg, model, trainer, world)
        else:
            while (batch := broadcast(None, rank, world)) is not None:
                try:
                    trainer.step(batch)
                except ValueError as exc:  # rank 0 skips the same batch for the same reason
                    log.error("rank %d skipped a batch: %s", rank, exc)
    finally:
        shutdown(world)


async def _serve(cfg: Config, model, trainer, world: int) -> None:
    import zmq
    import zmq.asyncio

    from turnstream.learner import checkpoint
    from turnstream.learner.device import served_dtype, serving_state_dict
    from turnstream.learner.distributed import broadcast
    from turnstream.learner.metrics import LearnerMetrics
    from turnstream.learner.trainer import NothingToTrain
    from turnstream.learner.weight_sync import WeightSyncError, weight_sync_from_config
    from turnstream.protocol.auth import (count_refusals, keys_for, make_server, refusal_counter, refusal_monitor,
                               start_authenticator)
    from turnstream.protocol.codec import encode
    from turnstream.protocol.http_metrics import start_metrics_server
    from turnstream.protocol.messages import VersionAnnouncement
    from turnstream.protocol.sockets import bind_address, configure
    from turnstream.core.audit import open_audit

    lc, net = cfg.learner, cfg.network
    metrics = LearnerMetrics()
    run_dir = Path(cfg.run.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sync = weight_sync_from_config(cfg, run_dir / "weights")
    push_dtype = served_dtype(cfg.vllm.dtype, cfg.model.path)  # master weights stay fp32; pushes are cast
    # The servers may hold other weights (a checkpoint we resumed past, an earlier run on a shared server):
    # give them ours before announcing, so version labels always name the weights that sampled.
    try:
        await sync.push(sync.save(serving_state_dict(model, push_dtype), trainer.version), trainer.version)
    except WeightSyncError as exc:
        metrics.push_failures.inc()
        log.error("initial push of version %d failed: %s", trainer.version, exc)
    metrics.version.set(trainer.version)

    ctx = zmq.asyncio.Context()
    curve = keys_for(net)
    pub = configure(ctx.socket(zmq.PUB), max_bytes=net.max_message_bytes)
    authenticator, refusals = None, None
    if curve is not None:  # the PUB is a server: only allow-listed subscribers hear the versions
        authenticator = start_authenticator(ctx, curve)
        make_server(pub, curve)
        # refused subscribers are counted (and logged sparingly), as the buffer counts refused peers
        refusals = asyncio.create_task(count_refusals(
            refusal_monitor(pub), refusal_counter(metrics.auth_failures, "pub", log)))
    pub.bind(bind_address(net.listen_host, net.learner_pub_port))
    batches = BatchClient(ctx, bind_address(net.buffer_address, net.buffer_serve_port), net.max_message_bytes, curve)
    http, port = await start_metrics_server(metrics.registry, net.listen_host, lc.metrics_port,
                                            health=lambda: {"version": trainer.version})
    log.info("learner: metrics port %d, %d vLLM server(s), %d rank(s), estimator %s", port, len(cfg.vllm.urls),
             world, lc.estimator)
    await pub.send_multipart(encode(VersionAnnouncement(trainer.version)))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log_file = (run_dir / "learner.jsonl").open("a")
    audit = open_audit(run_dir, "learner")  # None unless TURNSTREAM_AUDIT=1 (tests/fault/)
    watcher = asyncio.create_task(sync.watch())  # re-syncs servers that missed a push once they answer again
    members = asyncio.create_task(watch_urls_file(Path(cfg.vllm.urls_file), sync.set_urls,
                                                  cfg.vllm.health_interval_s)) if cfg.vllm.urls_file else None
    started = time.monotonic()
    overlap = push_overlaps_training(cfg)
    publishing: asyncio.Task | None = None  # the latest version's push and announcement
    log.info("weight pushes %s the next step", "overlap" if overlap else "precede")
    try:
        while not stop.is_set() and not (lc.max_steps and trainer.version >= lc.max_steps):
            waited = time.monotonic()
            fetch = asyncio.create_task(batches.get(trainer.version, cfg.buffer.batch_episodes, lc.batch_max_tokens))
            await asyncio.wait([fetch, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                fetch.cancel()
                break
            batch = fetch.result()
            if getattr(batch, "status", "ok") != "ok" or not batch.episode_ids:
                continue
            wait_s = time.monotonic() - waited
            try:
                batch = broadcast(batch, 0, world)
                step_started = time.time()
                stats = await asyncio.to_thread(trainer.step, batch)
            except NothingToTrain as exc:  # every episode dropped: counted, the learner keeps serving
                metrics.over_budget.inc(exc.over_budget)
                metrics.bad_tokens.inc(exc.bad_tokens)
                metrics.rejected_batches.inc()
                log.error("skipped a batch: %s", exc)
                continue
            except ValueError as exc:  # a batch the model cannot take (e.g. an episode that starts with an action)
                metrics.rejected_batches.inc()
                log.error("skipped a batch: %s", exc)
                continue
            if audit is not None:  # before the checkpoint, so a checkpointed step always has its line
                audit.write({"version": trainer.version, "batch_version": batch.learner_version,
                             "episodes": list(batch.episode_ids),
                             "tokens": [int(n) for n in batch.episode_offsets[1:] - batch.episode_offsets[:-1]],
                             "staleness_max": stats["staleness_max"]})
            path = await asyncio.to_thread(sync.save, serving_state_dict(model, push_dtype), trainer.version)
            if lc.checkpoint_every and trainer.version % lc.checkpoint_every == 0:
                ckpt_started = time.monotonic()
                await asyncio.to_thread(checkpoint.save, run_dir / "checkpoints", trainer.version, model,
                                        cfg.model.path, trainer.state_dict(), trainer.tracker.state_dict(),
                                        lc.keep_checkpoints)
                stats["checkpoint_s"] = time.monotonic() - ckpt_started
            stats.update(wait_s=wait_s, step_started=step_started)
            if publishing is not None:  # one push at a time: servers and announcements go in version order
                await publishing
            publishing = asyncio.create_task(_publish(sync, pub, path, trainer.version, stats, metrics, log_file,
                                                      started))
            if not overlap:
                await publishing
    finally:
        if publishing is not None:  # the last version still reaches the servers and the buffer
            await publishing
        watcher.cancel()
        if members is not None:
            members.cancel()
        if refusals is not None:
            refusals.cancel()
        broadcast(None, 0, world)  # release the other ranks
        log_file.close()
        if audit is not None:
            audit.close()
        if authenticator is not None:
            authenticator.stop()
        ctx.destroy(linger=0)
        await http.cleanup()


def push_overlaps_training(cfg: Config) -> bool:
    """Whether a version's push runs while the next step trains (learner.overlap_push).

    Safe only when the push reads a snapshot (the disk backend's saved file; nccl broadcasts the live
    parameters, which the next step changes), and only in asynchronous mode: with eta = 0 the synchronous
    baseline is generate, train, push, repeat, and every episode of a batch must come from the newest weights."""
    if cfg.learner.overlap_push == "auto":
        return cfg.vllm.weight_sync.backend == "disk" and cfg.buffer.eta >= 1
    return bool(cfg.learner.overlap_push)


async def _publish(sync, pub, path, version: int, stats: dict, metrics, log_file, started: float) -> None:
    """Push `version` into the servers, then announce it, then record the step's line."""
    from turnstream.learner.weight_sync import WeightSyncError
    from turnstream.protocol.codec import encode
    from turnstream.protocol.messages import VersionAnnouncement

    push_started = time.time()
    try:
        push_s = await sync.push(path, version)
    except WeightSyncError as exc:
        # Servers keep generating with older weights; their tokens carry the older version, so the
        # staleness bound still holds. The next push carries everything learned so far.
        metrics.push_failures.inc()
        log.error("weight push of version %d failed: %s", version, exc)
        push_s = float("nan")
    # announced only once the servers hold it: a version label always names the weights that sampled
    await pub.send_multipart(encode(VersionAnnouncement(version, str(path))))
    # push_started and step_started (wall clock) show in the log whether a push overlapped the next step
    stats.update(push_s=push_s, push_started=push_started, wall_s=time.monotonic() - started, time=time.time())
    metrics.record(stats)
    metrics.wait_seconds.observe(stats["wait_s"])
    if push_s == push_s:  # not NaN
        metrics.push_seconds.observe(push_s)
    log_file.write(json.dumps(stats) + "\n")
    log_file.flush()
    log.info("step %d: return %.3f, loss %.4f, staleness max %d, step %.2fs, push %.2fs, wait %.2fs",
             stats["version"], stats["return_mean"], stats["policy_loss"], stats["staleness_max"],
             stats["step_s"], push_s, stats["wait_s"])


def main(cfg: Config) -> None:
    if not cfg.vllm.urls:
        from turnstream.core.configtools import ConfigError

        raise ConfigError("vllm.urls: the learner needs at least one vLLM server URL to push weights to")
    asyncio.run(train(cfg))
