"""The [network] table: where roles bind and connect, and whether their ZeroMQ sockets use CURVE."""
from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field

from turnstream.core.config_fields import Port, Section


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or a wildcard such as 0.0.0.0 / *: traffic may leave the machine


def is_wildcard(host: str) -> bool:
    """0.0.0.0, :: or ZeroMQ's *: every interface, so no address a peer could connect to."""
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def curve_enabled(mode: str, host: str) -> bool:
    """"auto" encrypts exactly when traffic can leave the machine."""
    return mode == "on" or (mode == "auto" and not is_loopback(host))


class NetworkSection(Section):
    host: str = Field("127.0.0.1", description="where roles bind and connect")
    buffer_ingest_port: Port = Field(0, description="actors -> buffer (ROUTER); 0: the launcher picks one")
    buffer_serve_port: Port = Field(0, description="learner -> buffer (ROUTER); 0: the launcher picks one")
    learner_pub_port: Port = Field(
        0, description="learner -> everyone: version announcements (PUB); 0: the launcher picks one")
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1, description="largest ZeroMQ message a socket accepts")
    curve: Literal["off", "on", "auto"] = Field(
        "auto", description="CURVE authentication and encryption of every ZeroMQ socket (protocol/auth.py); auto: "
        "on whenever an address below is not a loopback address, so traffic that leaves the machine is never "
        "plaintext")
    keys_dir: str = Field(
        "", description="from `turnstream keygen DIR`: server.key(_secret), client.key_secret, allowed_clients/")
    # Roles on different hosts bind on one address and reach each other by name; each of these is `host`
    # when empty, so a single-host run sets only `host`.
    bind_host: str = Field("", description="where this process binds its sockets and /metrics, e.g. 0.0.0.0; "
                           "empty: host")
    buffer_host: str = Field("", description="where actors and the learner reach the buffer; empty: host")
    learner_host: str = Field("", description="where the buffer reaches the learner's PUB socket; empty: host")

    @property
    def listen_host(self) -> str:
        return self.bind_host or self.host

    @property
    def buffer_address(self) -> str:
        return self.buffer_host or self.host

    @property
    def learner_address(self) -> str:
        return self.learner_host or self.host

    @property
    def curve_enabled(self) -> bool:
        # "auto" encrypts when any address a socket binds or connects to can leave the machine
        return any(curve_enabled(self.curve, h) for h in (self.listen_host, self.buffer_address, self.learner_address))
