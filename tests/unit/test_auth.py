"""CURVE helpers, key generation and the network.curve / network.keys_dir checks (no sockets)."""
from __future__ import annotations

import stat

import pytest
import zmq.auth

from turnstream.protocol import auth
from turnstream.cli import main as cli_main
from turnstream.core.config import load_config
from turnstream.core.config_network import curve_enabled, is_loopback
from turnstream.core.configtools import ConfigError
from turnstream.keygen import main as keygen
from turnstream.checks.preflight import preflight


def test_keygen_writes_both_pairs_and_the_allow_list(tmp_path):
    d = tmp_path / "keys"
    assert keygen(d) == 0
    files = sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())
    assert files == ["allowed_clients/client.key", "client.key", "client.key_secret", "server.key",
                     "server.key_secret"]
    for secret in ("server.key_secret", "client.key_secret"):
        assert stat.S_IMODE((d / secret).stat().st_mode) == 0o600
        public, private = zmq.auth.load_certificate(d / secret)
        assert len(public) == 40 and private is not None and len(private) == 40
    assert zmq.auth.load_certificate(d / "allowed_clients" / "client.key")[0] == \
        zmq.auth.load_certificate(d / "client.key_secret")[0]
    keys = auth.CurveKeys.load(d)
    assert keys.server_public == zmq.auth.load_certificate(d / "server.key")[0]
    assert keygen(d) == 1  # never overwrites keys peers already hold


def test_keygen_subcommand(tmp_path):
    assert cli_main(["keygen", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k" / "server.key_secret").is_file()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.5", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("10.0.0.3", False),
                                            ("buffer.svc", False), ("*", False)])
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback
    assert curve_enabled("auto", host) is (not loopback)
    assert curve_enabled("on", host) and not curve_enabled("off", host)


def test_defaults_keep_loopback_runs_plaintext():
    cfg = load_config()
    assert cfg.network.curve == "auto" and cfg.network.keys_dir == ""
    assert not cfg.network.curve_enabled and auth.keys_for(cfg.network) is None


@pytest.mark.parametrize("overrides", [
    ["network.curve=on"],
    ["network.host=10.0.0.3"],  # auto with a non-loopback host
    ["network.buffer_host=buffer"],  # ... or any address a role binds or connects to
    ["network.bind_host=0.0.0.0"],
    ["network.curve=on", "network.keys_dir=does/not/exist"],
])
def test_curve_without_keys_is_a_one_line_error(overrides):
    with pytest.raises(ConfigError) as err:
        preflight(load_config(None, overrides))
    message = str(err.value)
    assert message.startswith("network.keys_dir: ") and "\n" not in message


def test_missing_client_secret_is_named(tmp_path):
    keygen(tmp_path)
    (tmp_path / "client.key_secret").unlink()
    with pytest.raises(ConfigError, match=r"^network\.keys_dir: .*client\.key_secret"):
        preflight(load_config(None, ["network.curve=on", f"network.keys_dir='{tmp_path}'"]))


def test_a_client_only_directory_loads_but_cannot_serve(tmp_path):
    """Actors need only server.key and client.key_secret; binding without the server secret is a config error."""
    full = tmp_path / "full"
    keygen(full)
    actor = tmp_path / "actor"
    actor.mkdir()
    for name in ("server.key", "client.key_secret"):
        (actor / name).write_bytes((full / name).read_bytes())
    cfg = preflight(load_config(None, ["network.curve=on", f"network.keys_dir='{actor}'"]))
    keys = auth.keys_for(cfg.network)
    assert keys is not None
    ctx = zmq.Context()
    try:
        with pytest.raises(ConfigError, match="server.key_secret"):
            auth.make_server(ctx.socket(zmq.ROUTER), keys)
    finally:
        ctx.destroy(linger=0)


def test_bad_curve_value():
    with pytest.raises(ConfigError, match="network.curve"):
        load_config(None, ["network.curve=maybe"])


def test_cli_reports_the_error_in_one_line(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[network]\ncurve = \"on\"\n")
    assert cli_main(["buffer", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("turnstream: config error: network.keys_dir:") and "\n" not in err
