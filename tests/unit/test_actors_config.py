"""Actor-side config: shipped configs load, new fields are validated with one-line errors, URL files."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.core.urls_file import read_urls_file, watch_urls_file
from turnstream.core.config import ConfigError, load_config
from turnstream.checks.preflight import preflight
from tests.unit.fake_vllm import FakeVllm

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["sokoban", "math_tool", "tictactoe", "http_env"])
def test_shipped_configs_load(name):
    cfg = preflight(load_config(REPO / "configs" / f"{name}.toml"))
    assert cfg.env.name in {"sokoban", "math_tool", "tictactoe", "http"}


@pytest.mark.parametrize("override, field", [
    ("vllm.retries=-1", "vllm.retries"),
    ("vllm.health_interval_s=0", "vllm.health_interval_s"),
    ("vllm.urls=['localhost:8000']", "vllm.urls"),
    ("vllm.weight_sync.backend=nccl", "vllm.weight_sync.master_address"),
    ("actor.max_turns=-2", "actor.max_turns"),
    ("env.args={size=2}", "env.args"),
])
def test_bad_values_name_the_field(override, field):
    overrides = [override] + (["env.name=sokoban"] if override.startswith("env.args") else [])
    with pytest.raises(ConfigError) as info:
        preflight(load_config(None, overrides))
    msg = str(info.value)
    assert "\n" not in msg and field in msg


def test_urls_file_parsing(tmp_path):
    f = tmp_path / "servers.txt"
    f.write_text("# fleet\nhttp://a:1\n\nhttp://b:2  # spare\nnot-a-url\n")
    assert read_urls_file(f) == ["http://a:1", "http://b:2"]
    f.write_text("# nothing\n")
    assert read_urls_file(f) is None and read_urls_file(tmp_path / "missing") is None


async def test_urls_file_adds_and_removes_servers_while_running(tmp_path):
    a, b = await FakeVllm("a").start(), await FakeVllm("b").start()
    f = tmp_path / "servers.txt"
    f.write_text(a.url + "\n")
    try:
        async with InferenceFleet([a.url], health_interval_s=0) as fleet:
            watcher = asyncio.create_task(watch_urls_file(f, fleet.set_urls, 0.02))
            f.write_text(b.url + "\n")
            for _ in range(200):
                if list(fleet.servers) == [b.url]:
                    break
                await asyncio.sleep(0.01)
            await fleet.generate([1], max_tokens=1, temperature=1.0)
            watcher.cancel()
            assert list(fleet.servers) == [b.url] and b.served == 1 and a.served == 0
    finally:
        await a.stop()
        await b.stop()
