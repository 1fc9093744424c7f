"""Small helpers shared by integration tests."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from turnstream.protocol.chunk_batch import pack
from turnstream.protocol.codec import encode
from turnstream.protocol.messages import AckBatch, TurnChunk
from turnstream.core.config import Config
from turnstream.launch.processes import ProcessGroup, free_port, tail


def chunk(episode_id: str, turn: int, *, seq: int, done: bool = False, actor_id: str = "actor-t", epoch: int = 1,
          version: int = 0, reward: float = 0.0, obs=(1, 2, 3), gen=(7,)) -> TurnChunk:
    return TurnChunk(
        actor_id=actor_id, epoch=epoch, seq=seq, episode_id=episode_id, turn=turn, prompt_key=f"p/{episode_id}",
        obs_tokens=np.asarray(obs, np.int32), gen_tokens=np.asarray(gen, np.int32),
        gen_logprobs=np.full(len(gen), -0.5, np.float32), gen_versions=np.full(len(gen), version, np.int32),
        reward=reward, done=done,
    )


def chunk_frames(*chunks: TurnChunk) -> list:
    """The frames an actor sends its chunks in (one turn_chunks message)."""
    return encode(pack(list(chunks)))


def in_process_buffer(*, batch_episodes: int = 4, eta: int = 20, version_addr: str | None = None, **server_kwargs):
    """(server, store, metrics): a BufferServer on free ports of 127.0.0.1, not yet running, over a store with
    room for 100 episodes whose staleness bound is `eta`; `server_kwargs` go to BufferServer."""
    from turnstream.buffer.metrics import BufferMetrics
    from turnstream.buffer.server import BufferServer
    from turnstream.buffer.store.replay_store import ReplayStore
    from turnstream.buffer.store_metrics import meter

    metrics = BufferMetrics()
    store = ReplayStore(batch_episodes=batch_episodes, eta=eta, max_staleness=eta, max_running=100, max_items=100,
                        episode_timeout_s=60, actor_timeout_s=60)
    meter(store, metrics)
    server = BufferServer(store, metrics, ingest_addr="tcp://127.0.0.1:0", serve_addr="tcp://127.0.0.1:0",
                          version_addr=version_addr, max_message_bytes=1 << 20, **server_kwargs)
    return server, store, metrics


async def stop_in_process_buffer(tasks, server, ctx) -> None:
    """Cancel a test's tasks, then close its in-process BufferServer and its ZeroMQ context."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    server.close()
    ctx.destroy(linger=0)


def acks_in(reply) -> list[tuple[int, str]]:
    """(seq, status) of every ack a buffer reply carries (none if it is not an `acks` message)."""
    if isinstance(reply, AckBatch):
        return [(seq, AckBatch.STATUSES[code]) for seq, code in zip(reply.seq.tolist(), reply.status.tolist())]
    return []


def poll_until(predicate, what: str, timeout_s: float, *, context=lambda: "", check=None,
               not_yet: tuple = (OSError,), interval_s: float = 0.2):
    """Poll `predicate` until it returns something truthy (returned). An exception in `not_yet` means "not
    yet" (a port that does not answer yet); `check()` runs every round and may fail early (a child that
    exited); on time-out the failure carries `context()` (log tails)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = predicate()
            if value:
                return value
        except not_yet:
            pass
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{context()}")
        time.sleep(interval_s)


async def until(condition, what: str = "condition", timeout_s: float = 10.0, interval_s: float = 0.01) -> None:
    """Await until `condition()` holds, letting the event loop run in between; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(interval_s)


def wait_for_child(predicate, what: str, child, timeout_s: float = 120.0):
    """poll_until, failing at once with the child's log tail if the child exits."""
    def alive() -> None:
        assert child.proc.poll() is None, f"{child.name} exited:\n{tail(child.log_path, 30)}"

    return poll_until(predicate, what, timeout_s, context=lambda: tail(child.log_path, 30), check=alive)


def http_json(url: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                 method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def scrape(url: str) -> dict[str, float]:
    """Prometheus text exposition -> {'name{labels}': value}."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def process_group_gone(pgid: int) -> bool:
    """True when neither the process nor anything left in its process group is alive."""
    try:
        os.killpg(pgid, 0)
        return False
    except ProcessLookupError:
        return True


@contextmanager
def launcher_running(config: Path, run_dir: Path, timeout_s: float = 240.0):
    """`turnstream up --config config`, yielded once the learner has logged a step (so every role has done
    work); its process group is killed on the way out if it still runs."""
    launcher = subprocess.Popen([sys.executable, "-m", "turnstream.cli", "up", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def alive() -> None:
            assert launcher.poll() is None, "launcher exited early"

        log = run_dir / "learner.jsonl"
        poll_until(lambda: log.exists() and log.read_text().strip(), "the first learner step", timeout_s,
                   check=alive, interval_s=1.0)
        yield launcher
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


def stop_launcher(launcher: subprocess.Popen, run_dir: Path, sig: int = signal.SIGTERM) -> None:
    """Signal the launcher; it exits as `up` does (Ctrl-C: status 0; SIGTERM: re-raised as SystemExit(128 + 15),
    so `finally` stops the roles), and every process group it started is gone."""
    pids = json.loads((run_dir / "pids.json").read_text())
    launcher.send_signal(sig)
    assert launcher.wait(timeout=60) == (0 if sig == signal.SIGINT else 128 + sig)
    assert all(process_group_gone(pid) for pid in pids.values()), pids


class CollectingLink:
    """Stands in for the buffer link in actor tests: keeps the chunks for inspection."""

    learner_version = 0

    def __init__(self):
        self.chunks = []

    async def send(self, chunk):
        chunk.seq = len(self.chunks)
        self.chunks.append(chunk)


async def play_episodes(url: str, model_dir, n: int, *, temperature: float = 1.0, max_new_tokens: int = 16,
                        model: str | None = None, env_factory=None, context_turns: int = 0, top_p: float = 1.0,
                        top_k: int = 0) -> list:
    """`n` episodes (of follow_signs, or `env_factory`'s environment) played at once by one EpisodeRunner against
    the vLLM server at `url`, sampling from `model` (a served LoRA adapter) or the base, truncated to `top_k` and
    `top_p`, the context restarting every `context_turns` turns (0: never); the TurnChunks it sent."""
    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.actors.inference.fleet import InferenceFleet
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.actors.play.context import Sampling
    from turnstream.actors.play.env_loop import EnvironmentLoop
    from turnstream.actors.envs.registry import make_env
    from turnstream.actors.tasks.orders import RandomOrder
    from turnstream.actors.tasks.source import TaskSource
    from turnstream.actors.play.runner import EpisodeRunner

    link = CollectingLink()
    async with InferenceFleet([url], model=model) as client:
        player = EnvironmentLoop(env_factory or (lambda: make_env("follow_signs")))
        runner = EpisodeRunner(actor_id="t", epoch=1, player=player,
                               chat=ChatTokens(model_dir), client=client, link=link,
                               sampling=Sampling(temperature, max_new_tokens, 512, context_turns=context_turns,
                                                 top_p=top_p, top_k=top_k),
                               metrics=ActorMetrics(), tasks=TaskSource(RandomOrder(3)))
        await asyncio.gather(*(runner.play(f"e{i}", seed=i) for i in range(n)))
    return link.chunks


def link_to_router(ctx, actor_id: str, *, slots: int, heartbeat_s: float):
    """A real BufferLink connected to a bare ROUTER on 127.0.0.1 that plays the buffer: (router, link, metrics)."""
    import zmq

    from turnstream.actors.link import BufferLink
    from turnstream.actors.metrics import ActorMetrics

    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    metrics = ActorMetrics()
    link = BufferLink(ctx, f"tcp://127.0.0.1:{port}", actor_id=actor_id, epoch=1, slots=slots, max_unacked=100,
                      resend_after_s=60.0, metrics=metrics, max_message_bytes=1 << 24, heartbeat_s=heartbeat_s)
    return router, link, metrics


class BufferProcess:
    """One buffer configuration that can be started, SIGKILLed (by PID) and started again."""

    def __init__(self, tmp_path, *, max_message_bytes: int | None = None, **buffer_overrides):
        cfg = Config()
        cfg.run.run_dir = str(tmp_path / "run")
        cfg.network.buffer_ingest_port = free_port()
        cfg.network.buffer_serve_port = free_port()
        cfg.buffer.metrics_port = free_port()
        if max_message_bytes is not None:
            cfg.network.max_message_bytes = max_message_bytes
        cfg.buffer.batch_episodes, cfg.buffer.eta, cfg.buffer.max_staleness = 2, 4, 4
        for key, value in buffer_overrides.items():
            setattr(cfg.buffer, key, value)
        self.cfg, self.tmp_path = cfg, tmp_path
        self.path = tmp_path / "config.toml"
        self.path.write_text(cfg.dumps())
        self.procs = ProcessGroup(tmp_path)
        self.child = None
        self.starts = 0
        self.metrics_url = f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics"

    def start(self):
        self.starts += 1
        name = f"buffer-{self.starts}"
        self.child = self.procs.start(name, [sys.executable, "-m", "turnstream.cli", "buffer", "--config",
                                             str(self.path)])
        return wait_for_child(lambda: scrape(self.metrics_url), "the buffer's metrics", self.child, timeout_s=60)

    def kill9(self):
        os.kill(self.child.proc.pid, signal.SIGKILL)
        self.child.proc.wait(10)

    def metric(self, key):
        return scrape(self.metrics_url).get(key, 0.0)


def session_server_config(url: str, tiny_model, tmp_path: Path) -> Config:
    """A run of separately started roles on the session's vLLM server (`url`), with free ports of its own."""
    cfg = Config()
    cfg.run.run_dir = str(tmp_path / "run")
    cfg.model.path = str(tiny_model)
    cfg.vllm.urls = [url]
    cfg.vllm.max_model_len = 512  # within the session server's
    for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port"):
        setattr(cfg.network, name, free_port())
    return cfg


def restore_served_weights(url, tiny_model, tmp_path):
    """A learner pushed into the session's vLLM server: put the original weights and version 0 back."""
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.buckets import WeightBuckets

    sync = DiskWeightSync([url], tmp_path / "restore", tiny_model)
    state = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    asyncio.run(sync.push(sync.save(WeightBuckets(state, None), 1), 1))
    asyncio.run(sync.set_version(0))


def start_run(procs: ProcessGroup, config: Path, *, actors: int = 1, learner_env: dict | None = None,
              buffer_env: dict | None = None) -> None:
    """Start a buffer, a learner and `actors` actors on `config`; `*_env` are added to a role's environment."""
    role = [sys.executable, "-m", "turnstream.cli"]
    procs.start("buffer", [*role, "buffer", "--config", str(config)], env=buffer_env)
    procs.start("learner", [*role, "learner", "--config", str(config)], env=learner_env)
    for i in range(actors):
        procs.start(f"actor-{i}", [*role, "actor", "--config", str(config), "--index", str(i)])


def jsonl_lines(path: Path) -> list[dict]:
    """The records of a JSON-lines file a role writes (learner.jsonl, an audit trail); none before it exists."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_audited(cfg: Config, tmp_path: Path, vllm_url: str, tiny_model, done, progress,
                timeout_s: float = 240.0) -> tuple[dict[str, float], list[dict], list[dict], list[dict]]:
    """Run a buffer (audit trail on, metrics on a free port), a learner and an actor on the session's vLLM server
    until `done(learner steps)`, scrape the buffer's metrics, stop every role and put the served weights back.
    Returns the metrics (scraped before the stop: the audit trail may hold a batch more), learner.jsonl's steps
    read just before the scrape (every one trained on batches the scraped counters already count), its steps at
    the end, and the buffer's audit trail. `progress(steps)` says how far it got when it times out."""
    cfg.buffer.metrics_port = free_port()
    config = tmp_path / "run.toml"
    config.write_text(cfg.dumps())
    steps_file = Path(cfg.run.run_dir) / "learner.jsonl"
    procs = ProcessGroup(tmp_path)
    try:
        start_run(procs, config, buffer_env={"TURNSTREAM_AUDIT": "1"})
        run_until(procs, lambda: done(jsonl_lines(steps_file)), lambda: progress(jsonl_lines(steps_file)), timeout_s)
        steps_at_scrape = jsonl_lines(steps_file)
        metrics = scrape(f"http://127.0.0.1:{cfg.buffer.metrics_port}/metrics")
    finally:
        procs.stop_all()
        restore_served_weights(vllm_url, tiny_model, tmp_path)
    return (metrics, steps_at_scrape, jsonl_lines(steps_file),
            jsonl_lines(Path(cfg.run.run_dir) / "audit" / "buffer.jsonl"))


def assert_every_episode_left_once(audit: list[dict]) -> tuple[list[str], list[str]]:
    """The buffer's audit trail closes its books: each acked, finished episode left the store at most once, served
    or dropped. Returns the ids served and dropped."""
    served = [e for r in audit if "served" in r for e in r["served"]]
    dropped = [e for r in audit if "dropped" in r for e in r["dropped"]]
    finished = {r["ep"] for r in audit if r.get("ack") == "ok" and r["done"]}
    assert len(served) == len(set(served)) and not set(served) & set(dropped), "an episode left the store twice"
    assert set(served) | set(dropped) <= finished  # only what an actor finished and had acked
    return served, dropped


def roles_log(procs: ProcessGroup, lines: int = 15) -> str:
    return "\n".join(f"--- {c.name}\n{tail(c.log_path, lines)}" for c in procs.children)


def run_until(procs: ProcessGroup, done, progress, timeout_s: float) -> None:
    """Poll `done()` every second while every role lives; fail with `progress()` and the logs after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert all(c.proc.poll() is None for c in procs.children), f"a role died\n{roles_log(procs)}"
        assert time.monotonic() < deadline, f"{progress()} within {timeout_s} s\n{roles_log(procs)}"
        time.sleep(1)


def run_on_ranks(script: str | Path, out: Path, ranks: int = 2, timeout_s: float = 600) -> None:
    """`script OUT` on `ranks` gloo ranks under torchrun (real processes, 127.0.0.1, a free port), with this
    checkout importable; fails with the ranks' output tails if torchrun does."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(script), str(out)]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
