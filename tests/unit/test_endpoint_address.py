"""Where the actor's OpenAI-compatible endpoint binds and what its episodes' base URLs name (actor.endpoint_*),
and the start-up checks of the addresses a role binds and the peers it reaches (turnstream/checks/addresses.py).
Across hosts: tests/integration/test_cluster_agent_endpoint.py; through the role CLI:
tests/integration/test_bad_addresses.py."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from turnstream.actors.play.endpoint.address import EndpointAddress
from turnstream.actors.play.endpoint.metrics import AgentMetrics
from turnstream.actors.play.endpoint.server import OpenAIEndpoint
from turnstream.checks.addresses import bind_problem, check_role_addresses, resolve_problem
from turnstream.core.config import ConfigError, load_config
from turnstream.launch.processes import free_port


def test_by_default_the_endpoint_binds_loopback_on_a_free_port_and_urls_name_loopback():
    assert EndpointAddress.for_actor(load_config(), 3) == EndpointAddress("127.0.0.1", "127.0.0.1", 0)


def test_an_endpoint_on_every_interface_is_advertised_at_the_hosts_bind_address_unless_told():
    on_all = ["actor.endpoint_bind_host=0.0.0.0", "actor.endpoint_port=8100", "network.bind_host=10.77.0.3"]
    assert EndpointAddress.for_actor(load_config(overrides=on_all), 2) == EndpointAddress("0.0.0.0", "10.77.0.3", 8102)
    told = load_config(overrides=[*on_all, "actor.endpoint_advertise_host=actor-3.cluster"])
    assert EndpointAddress.for_actor(told, 0).url_host == "actor-3.cluster"
    one_address = load_config(overrides=["actor.endpoint_bind_host=10.77.0.4"])
    assert EndpointAddress.for_actor(one_address, 0).url_host == "10.77.0.4"


def test_an_endpoint_on_every_interface_with_no_address_to_advertise_is_a_config_error():
    cfg = load_config(overrides=["actor.endpoint_bind_host=0.0.0.0"])
    with pytest.raises(ConfigError, match=r"^actor\.endpoint_advertise_host: .*0\.0\.0\.0 binds every interface"):
        EndpointAddress.for_actor(cfg, 0)
    cfg.network.bind_host = "0.0.0.0"  # a wildcard says no more
    with pytest.raises(ConfigError, match=r"^actor\.endpoint_advertise_host: "):
        check_role_addresses(cfg, "actor")
    for wildcard in ("0.0.0.0", "::"):
        with pytest.raises(ConfigError, match=r"^actor\.endpoint_advertise_host: a wildcard .* is no address"):
            load_config(overrides=[f'actor.endpoint_advertise_host="{wildcard}"'])


def test_the_endpoint_listens_where_it_is_told_and_base_urls_name_the_advertised_host():
    async def main():
        port = free_port()
        endpoint = await OpenAIEndpoint(AgentMetrics(CollectorRegistry()),
                                        EndpointAddress("127.0.0.1", "localhost", port)).start()
        try:
            url = endpoint.base_url("e1")
            assert url == f"http://localhost:{port}/episodes/e1/v1"
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/chat/completions", json={}) as resp:
                    assert resp.status == 404 and (await resp.json())["error"]["code"] == "unknown_episode"
        finally:
            await endpoint.close()
        ipv6 = OpenAIEndpoint(AgentMetrics(CollectorRegistry()), EndpointAddress("::", "fd00::5", 8100))
        ipv6.port = 8100
        assert ipv6.base_url("e2") == "http://[fd00::5]:8100/episodes/e2/v1"

    asyncio.run(main())


def test_an_address_is_bindable_only_where_an_interface_has_it():
    assert bind_problem("127.0.0.1") == "" and bind_problem("0.0.0.0") == "" and bind_problem("*") == ""
    # 10.77.0.x is the test clusters' private subnet: no interface of the machine's own namespace has it, so
    # the bind fails locally and nothing is sent
    assert bind_problem("10.77.0.99").startswith("cannot bind 10.77.0.99 on this host (")
    assert resolve_problem("10.77.0.99") == "" and resolve_problem("localhost") == ""


@pytest.mark.parametrize("role, setting", [("buffer", "network.bind_host"), ("learner", "network.bind_host"),
                                           ("actor", "actor.endpoint_bind_host")])
def test_each_role_names_the_setting_of_an_address_it_cannot_bind(role, setting):
    cfg = load_config(overrides=[f'{setting}="10.77.0.99"'])
    with pytest.raises(ConfigError, match=rf"^{setting}: cannot bind 10\.77\.0\.99"):
        check_role_addresses(cfg, role)
    cfg = load_config(overrides=['network.host="10.77.0.99"'])  # bind_host empty: host is what binds
    with pytest.raises(ConfigError, match=r"^network\.host: cannot bind"):
        check_role_addresses(cfg, role)


def test_a_learner_name_that_does_not_resolve_yet_is_a_warning_a_buffer_name_an_error(monkeypatch, caplog):
    # no name is looked up here: the resolver's answer is given
    monkeypatch.setattr("turnstream.checks.addresses.resolve_problem", lambda host: f"{host} does not resolve here")
    cfg = load_config(overrides=['network.learner_host="learner"', 'network.buffer_host="buffer"',
                                 "network.learner_pub_port=5557"])
    check_role_addresses(cfg, "buffer")  # the learner may start after the buffer
    assert "network.learner_host: learner does not resolve here; going on" in caplog.text
    for role in ("learner", "actor"):
        with pytest.raises(ConfigError, match=r"^network\.buffer_host: buffer does not resolve here"):
            check_role_addresses(cfg, role)
