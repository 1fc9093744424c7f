"""A role given an address it cannot bind, or a peer whose name does not resolve, stops at start with one line
naming the setting (turnstream/checks/addresses.py), exit status 2, never a traceback: the real role CLI,
`turnstream buffer | learner | actor --config X`, as a subprocess.

Nothing is sent anywhere: 10.77.0.99 is on the test clusters' private subnet, which no interface of this
machine's own namespace has, so its bind fails locally; a name is looked up from inside a host of a test
cluster (tests/cluster.py), which has no route to any resolver, so no query leaves the machine."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cluster import Cluster, cluster_unavailable

UNBOUND = "10.77.0.99"


def run_role(role: str, tmp_path, overrides: list[str], host=None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "turnstream.cli", role, "--config", str(config(tmp_path))]
    for item in overrides:
        argv += ["--set", item]
    return subprocess.run(host.command(argv) if host else argv, capture_output=True, text=True, timeout=120)


def config(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\nrun_dir = "{tmp_path / "run"}"\n\n[network]\ncurve = "off"\n\n'
                    '[vllm]\nurls = ["http://127.0.0.1:9"]\n')
    return path


def assert_one_line(done: subprocess.CompletedProcess, line: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"turnstream: config error: {line}"), done.stderr


@pytest.mark.parametrize("role, setting", [("buffer", "network.bind_host"), ("learner", "network.bind_host"),
                                           ("actor", "network.bind_host"), ("actor", "actor.endpoint_bind_host")])
def test_an_address_no_interface_has_stops_the_role_with_one_line_naming_the_setting(role, setting, tmp_path):
    done = run_role(role, tmp_path, [f'{setting}="{UNBOUND}"'])
    assert_one_line(done, f"{setting}: cannot bind {UNBOUND} on this host (Cannot assign requested address)")


def test_an_endpoint_on_every_interface_with_no_address_for_agents_stops_the_actor(tmp_path):
    done = run_role("actor", tmp_path, ['actor.endpoint_bind_host="0.0.0.0"'])
    assert_one_line(done, "actor.endpoint_advertise_host: actor.endpoint_bind_host = 0.0.0.0 binds every interface")


@pytest.mark.skipif(bool(reason := cluster_unavailable()), reason=reason or "")
@pytest.mark.parametrize("role", ["learner", "actor"])
def test_a_buffer_name_that_does_not_resolve_stops_the_role_with_one_line_naming_the_setting(role, tmp_path):
    with Cluster(["lonely"]) as cluster:
        done = run_role(role, tmp_path, ['network.buffer_host="no-such-host.invalid"'], host=cluster["lonely"])
    assert_one_line(done, "network.buffer_host: no-such-host.invalid does not resolve here (")
