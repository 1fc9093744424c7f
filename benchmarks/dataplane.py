"""`turnstream bench dataplane`: actor-side sender -> buffer throughput (acked), vs raw pyzmq PUSH/PULL.

For each chunk size (2 KB and 1 MB turn chunks, one-turn episodes) it measures, in one run on one machine:
- raw:     pyzmq PUSH (this process) -> PULL (a child process) of the same multipart frames (one chunk's
           turn_chunks message), encoded once, until the receiver has them all: the transport's ceiling, with
           no encoding, acks, decoding or storage;
- ack_only: actors.link.BufferLink (this process) -> a child process that keeps and acks every chunk, as the
           buffer's ingest loop does (delayed acks included), and nothing else: the protocol's ceiling without
           the buffer's work;
- ours:    actors.link.BufferLink (this process) -> the real buffer process (`turnstream buffer`), from the
           first send until the last ack, write-ahead log off;
- ours_ack0: ours with buffer.ack_delay_ms = 0, every drained group acked at once, to show what delayed
           acks (buffer/acks.py) buy;
- ours_wal: as ours, with the write-ahead log on, fsync "always" (an ack means fsynced).
Each row also reports the CPU time the sending and the receiving process spent per chunk (all their threads,
libzmq's I/O threads included) and the receiver's main thread alone, from /proc (Linux): on a machine with
few cores, where sender and receiver share them, the sum of the two bounds throughput, and the receiver's
main thread is the single thread a faster buffer would have to relieve.
Every row runs --repeats times (5), interleaved (raw, ours, ack_only, ours_ack0, ours_wal, then again): on a shared
machine one measurement can differ from the next by half, so the figures are medians over repeats and each
ratio is the median of the per-repeat ratios, whose two rows ran seconds apart (raw and ours back to back).
Prints a human-readable table, then one JSON line last with ratio_small / ratio_large (ours / raw, without
the log) and their range over repeats, every absolute figure and every repeat ("runs"). Processes it starts
are stopped by PID.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.dataplane_receivers import ACKER, RECEIVER, CpuClock


def make_chunk_arrays(target_bytes: int):
    """obs/gen arrays whose chunk, alone in its message, encodes to about target_bytes."""
    n_gen = 32 if target_bytes < 100_000 else 64
    gen = np.arange(n_gen, dtype=np.int32)
    arrays = dict(gen_tokens=gen, gen_logprobs=np.full(n_gen, -0.5, np.float32),
                  gen_versions=np.zeros(n_gen, np.int32))
    overhead = encoded_bytes(np.zeros(1, np.int32), arrays) - 4
    n_obs = max(1, (target_bytes - overhead) // 4)
    obs = (np.arange(n_obs, dtype=np.int64) % 30000).astype(np.int32)
    return obs, arrays


def chunk_at(i: int, obs, arrays):
    from turnstream.protocol.messages import TurnChunk

    return TurnChunk("bench-actor", 1, 0, f"ep{i}", 0, "bench/p", obs, reward=0.0, done=True, **arrays)


def chunk_frames(obs, arrays) -> list:
    """The frames of one chunk in the message the link sends it in."""
    from turnstream.protocol.chunk_batch import pack
    from turnstream.protocol.codec import encode

    return encode(pack([chunk_at(0, obs, arrays)]))


def encoded_bytes(obs, arrays) -> int:
    return sum(memoryview(f).nbytes for f in chunk_frames(obs, arrays))


def bench_raw(n: int, obs, arrays) -> tuple[float, dict]:
    """Seconds to push n messages (one chunk's frames) through PUSH -> PULL to another process, and the CPU per
    chunk (CpuClock.stop)."""
    import zmq

    from turnstream.launch.processes import free_port

    port, ctl = free_port(), free_port()
    frames = [bytes(f) for f in chunk_frames(obs, arrays)]  # the same bytes for every message
    child = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port), str(n), str(ctl)])
    ctx = zmq.Context()
    try:
        pair = _ready_child(ctx, ctl, "raw receiver")
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 10000)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.3)
        cpu = CpuClock(child.pid)
        cpu.start()
        pair.send(b"go")
        t0 = time.perf_counter()
        copy = max(map(len, frames)) < 65536  # as the link sends: a large frame zero-copy
        for _ in range(n):  # the transport's ceiling: no encoding in the loop
            push.send_multipart(frames, copy=copy)
        assert pair.poll(120_000), "raw receiver did not finish"
        pair.recv()
        elapsed = time.perf_counter() - t0
        return elapsed, cpu.stop(n)
    finally:
        ctx.destroy(linger=0)
        child.kill()
        child.wait()


def bench_ack_only(n: int, obs, arrays, window: int, ack_delay_ms: float) -> tuple[float, dict]:
    """BufferLink -> a child process that keeps and acks every chunk and does nothing else (ACKER): the
    link and its acks without the buffer's work (decode, validation, storage, credits), timed as ours."""
    import zmq

    from turnstream.launch.processes import free_port

    port, ctl = free_port(), free_port()
    child = subprocess.Popen([sys.executable, "-c", ACKER, str(port), str(ctl), str(ack_delay_ms / 1000)])
    ctx = zmq.Context()
    try:
        _ready_child(ctx, ctl, "ack-only receiver")
        return asyncio.run(_send_all(port, n, obs, arrays, window, CpuClock(child.pid)))
    finally:
        ctx.destroy(linger=0)
        child.kill()
        child.wait()


def _ready_child(ctx, ctl: int, what: str):
    """The PAIR socket to a receiver child process, once the child said "ready" on it."""
    import zmq

    pair = ctx.socket(zmq.PAIR)
    pair.setsockopt(zmq.LINGER, 0)
    pair.connect(f"tcp://127.0.0.1:{ctl}")
    assert pair.poll(120_000), f"{what} did not start"
    pair.recv()
    return pair


def bench_ours(n: int, obs, arrays, *, wal: bool, window: int, workdir: Path,
               ack_delay_ms: float | None = None) -> tuple[float, dict]:
    """Seconds from the first BufferLink.send to the last ack from a real buffer process, and CPU per chunk."""
    from turnstream.core.config import Config
    from turnstream.launch.processes import ProcessGroup, free_port

    cfg = Config()
    name = f"{wal}-{ack_delay_ms}-{obs.size}"
    # a fresh run directory per measurement: a repeat must not replay the previous one's write-ahead log
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=workdir))
    cfg.run.run_dir = str(workdir / "run")
    cfg.network.buffer_ingest_port, cfg.network.buffer_serve_port = free_port(), free_port()
    cfg.buffer.metrics_port = free_port()
    cfg.buffer.wal, cfg.buffer.wal_fsync = wal, "always"
    cfg.buffer.max_items = cfg.buffer.max_running = max(cfg.buffer.max_items, n + 1)
    cfg.buffer.eta = cfg.buffer.max_staleness = 1000
    if ack_delay_ms is not None:
        cfg.buffer.ack_delay_ms = ack_delay_ms
    path = workdir / f"bench-{name}.toml"
    path.write_text(cfg.dumps())
    procs = ProcessGroup(workdir)
    child = procs.start(f"buffer-{name}", [sys.executable, "-m", "turnstream.cli", "buffer", "--config", str(path)])
    try:
        _wait_up(cfg.buffer.metrics_port, child)
        return asyncio.run(_send_all(cfg.network.buffer_ingest_port, n, obs, arrays, window,
                                     CpuClock(child.proc.pid)))
    finally:
        procs.stop_all()


async def _send_all(port: int, n: int, obs, arrays, window: int, cpu: CpuClock) -> tuple[float, dict]:
    """Send n chunks through a BufferLink to the receiver on `port`; seconds until the last ack, and CPU."""
    import zmq.asyncio

    from turnstream.actors.link import BufferLink
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.protocol.codec import DEFAULT_MAX_MESSAGE_BYTES

    ctx = zmq.asyncio.Context()
    link = BufferLink(ctx, f"tcp://127.0.0.1:{port}", actor_id="bench-actor", epoch=1, slots=0,
                      max_unacked=window, resend_after_s=60.0, metrics=ActorMetrics(),
                      max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES)
    task = asyncio.create_task(link.run())
    try:
        await asyncio.sleep(0.3)
        cpu.start()
        t0 = time.perf_counter()
        for i in range(n):
            await link.send(chunk_at(i, obs, arrays))
        await asyncio.wait_for(_all_delivered(link, n), 300)  # a receiver that died leaves chunks unacked: fail
        elapsed = time.perf_counter() - t0
        used = cpu.stop(n)
        acked_ok = link.m.registry.get_sample_value("turnstream_actor_acks_total", {"status": "ok"})
        assert acked_ok == n, "not every chunk was acked ok"
        return elapsed, used
    finally:
        task.cancel()
        ctx.destroy(linger=0)


async def _all_delivered(link, n: int) -> None:
    """Return once chunks 0..n-1 are acked (each wait returns at once for a chunk acked already)."""
    for seq in range(n):
        await link.delivered(seq)


def _wait_up(port: int, child) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).read()
            return
        except OSError:
            if child.proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(child.log_path).read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError("buffer did not start; the end of its log:\n" + "\n".join(tail))
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="turnstream bench dataplane", description=__doc__.splitlines()[0])
    p.add_argument("--small-bytes", type=int, default=2048)
    p.add_argument("--large-bytes", type=int, default=1 << 20)
    p.add_argument("--small-count", type=int, default=20000, help="2 KB chunks per measurement")
    p.add_argument("--large-count", type=int, default=1000, help="1 MB chunks per measurement")
    p.add_argument("--small-window", type=int, default=1024, help="unacked window (actor.max_unacked)")
    p.add_argument("--large-window", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5,
                   help="measure every row this many times, interleaved; figures are medians")
    args = p.parse_args(argv)
    from turnstream.core.config import Config

    ack_delay_ms = Config().buffer.ack_delay_ms  # the ack-only receiver delays its acks as the buffer does
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="turnstream-bench-") as tmp:
        for label, size, count, window in (("small", args.small_bytes, args.small_count, args.small_window),
                                           ("large", args.large_bytes, args.large_count, args.large_window)):
            obs, arrays = make_chunk_arrays(size)
            nbytes = encoded_bytes(obs, arrays)
            # raw and ours first and back to back: the headline ratio compares the closest pair in time
            rows = {"raw": lambda: bench_raw(count, obs, arrays),
                    "ours": lambda: bench_ours(count, obs, arrays, wal=False, window=window, workdir=Path(tmp)),
                    "ack_only": lambda: bench_ack_only(count, obs, arrays, window, ack_delay_ms),
                    "ours_ack0": lambda: bench_ours(count, obs, arrays, wal=False, window=window,
                                                    workdir=Path(tmp), ack_delay_ms=0.0),
                    "ours_wal": lambda: bench_ours(count, obs, arrays, wal=True, window=window, workdir=Path(tmp))}
            runs: list[dict] = []
            for repeat in range(args.repeats):  # every row once per repeat, so each ratio compares neighbours
                figures = {}
                for name, run in rows.items():
                    seconds, cpu = run()
                    figures[f"{name}_chunks_per_s"] = round(count / seconds, 1)
                    figures.update({f"{name}_{key}_per_chunk": value for key, value in cpu.items()})
                    cpu_text = "  CPU us/chunk: " + ", ".join(f"{key.removesuffix('_cpu_us')} {value:.0f}"
                                                             for key, value in cpu.items()) if cpu else ""
                    print(f"{label:5s} {name:11s} {nbytes:>8d} B  {count / seconds:>10.1f} chunks/s  "
                          f"{count * nbytes / seconds / 1e6:>9.2f} MB/s{cpu_text}  (repeat {repeat + 1})", flush=True)
                runs.append(figures)
            result[label] = {"chunk_bytes": nbytes, "chunks": count, "repeats": args.repeats,
                             **{key: statistics.median(r[key] for r in runs) for key in runs[0]}}
            for name in rows:
                result[label][f"{name}_mb_per_s"] = round(result[label][f"{name}_chunks_per_s"] * nbytes / 1e6, 2)
            result[label]["runs"] = runs

    def ratios(label: str, top: str, bottom: str) -> list[float]:
        """top / bottom per repeat, each pair measured a few seconds apart."""
        return [r[f"{top}_chunks_per_s"] / r[f"{bottom}_chunks_per_s"] for r in result[label]["runs"]]

    def ratio(label: str, top: str, bottom: str) -> float:
        return round(statistics.median(ratios(label, top, bottom)), 3)

    result["ratio_small"] = ratio("small", "ours", "raw")
    result["ratio_large"] = ratio("large", "ours", "raw")
    # the spread of the headline ratios over repeats: what one measurement on this machine can say
    for label in ("small", "large"):
        per_repeat = ratios(label, "ours", "raw")
        result[f"ratio_{label}_range"] = [round(min(per_repeat), 3), round(max(per_repeat), 3)]
    result["ack_only_small"] = ratio("small", "ack_only", "raw")  # the protocol's ceiling: no buffer work
    result["ack_only_large"] = ratio("large", "ack_only", "raw")
    result["ack_delay_gain_small"] = ratio("small", "ours", "ours_ack0")  # delayed acks against none
    result["ack_delay_gain_large"] = ratio("large", "ours", "ours_ack0")
    result["wal_cost_small"] = round(1 - ratio("small", "ours_wal", "ours"), 3)
    result["wal_cost_large"] = round(1 - ratio("large", "ours_wal", "ours"), 3)
    print(json.dumps(result))
    return 0
