"""CURVE authentication and encryption for the ZeroMQ sockets (the "Ironhouse" pattern).

Servers (sockets that bind: the buffer's ROUTERs, the learner's PUB) prove who they are with the server
secret key and accept only clients whose public key sits in `allowed_clients/`; clients (DEALERs, SUBs)
pin the server's public key, so a stranger can neither read the traffic nor inject into it. Without the
allow-list anyone holding the server's public key could connect, hence the ZAP authenticator.

Key directory layout (`turnstream keygen DIR` writes it):
    server.key          server public key (all that clients need of the server)
    server.key_secret   server key pair (only the roles that bind: buffer, learner)
    client.key_secret   client key pair (every role: actors, the learner and the buffer connect)
    allowed_clients/    *.key public keys of the clients the servers accept
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.asyncio import AsyncioAuthenticator

from turnstream.core.configtools import ConfigError

SERVER_PUBLIC = "server.key"
SERVER_SECRET = "server.key_secret"
CLIENT_SECRET = "client.key_secret"
ALLOWED_DIR = "allowed_clients"


def keys_problem(keys_dir: str) -> str:
    """What is missing for a client (every role is one); "" when the directory is usable."""
    if not keys_dir:
        return "CURVE is on but no key directory is set (create one with `turnstream keygen DIR`)"
    d = Path(keys_dir)
    if not d.is_dir():
        return f"{keys_dir} is not a directory (create one with `turnstream keygen DIR`)"
    if not (d / SERVER_PUBLIC).is_file() and not (d / SERVER_SECRET).is_file():
        return f"{keys_dir} holds neither {SERVER_PUBLIC} nor {SERVER_SECRET}"
    if not (d / CLIENT_SECRET).is_file():
        return f"{keys_dir} has no {CLIENT_SECRET}"
    return ""


@dataclass(frozen=True)
class CurveKeys:
    """The keys every role needs as a client; the server secret is read only by make_server."""

    keys_dir: Path
    server_public: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def load(cls, keys_dir: str | Path) -> CurveKeys:
        problem = keys_problem(str(keys_dir))
        if problem:
            raise ConfigError(f"network.keys_dir: {problem}")
        d = Path(keys_dir)
        server_file = d / SERVER_PUBLIC if (d / SERVER_PUBLIC).is_file() else d / SERVER_SECRET
        server_public, _ = zmq.auth.load_certificate(server_file)
        client_public, client_secret = zmq.auth.load_certificate(d / CLIENT_SECRET)
        if client_secret is None:
            raise ConfigError(f"network.keys_dir: {d / CLIENT_SECRET} holds no secret key")
        return cls(d, server_public, client_public, client_secret)


def make_client(sock: zmq.Socket, keys: CurveKeys) -> zmq.Socket:
    """Before connect: pin the server's key and present ours."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.client_public
    sock.curve_secretkey = keys.client_secret
    return sock


def make_server(sock: zmq.Socket, keys: CurveKeys) -> zmq.Socket:
    """Before bind (libzmq reads the mechanism when a peer connects, but bind-after-set is the documented order)."""
    secret_file = keys.keys_dir / SERVER_SECRET
    if not secret_file.is_file():
        raise ConfigError(f"network.keys_dir: {keys.keys_dir} has no {SERVER_SECRET}, which a binding role needs")
    public, secret = zmq.auth.load_certificate(secret_file)
    if secret is None:
        raise ConfigError(f"network.keys_dir: {secret_file} holds no secret key")
    sock.curve_server = True
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    return sock


def start_authenticator(ctx: zmq.Context, keys: CurveKeys) -> AsyncioAuthenticator:
    """One ZAP handler per context checks every CURVE server socket of it against the allow-list.

    Call from a running event loop. With no IP allow/deny list every address passes the IP stage, so the
    public key alone decides.
    """
    allowed = keys.keys_dir / ALLOWED_DIR
    if not allowed.is_dir():
        raise ConfigError(f"network.keys_dir: {keys.keys_dir} has no {ALLOWED_DIR}/ of accepted client keys")
    auth = AsyncioAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(allowed))
    return auth


# Monitor events that mean "a peer tried and was refused" -> the `reason` label: a key not on the
# allow-list (auth), a malformed or mismatched handshake (protocol), one libzmq gives no detail for.
# A plaintext peer (security mechanism mismatch) shows up as protocol or no_detail, depending on timing.
REFUSAL_EVENTS = {zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
                  zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "no_detail"}


def refusal_monitor(sock: zmq.Socket) -> zmq.Socket:
    """A PAIR socket that receives the handshake-failure events of `sock` (zmq.utils.monitor format)."""
    events = 0
    for e in REFUSAL_EVENTS:
        events |= e
    return sock.get_monitor_socket(events)


def keys_for(network) -> CurveKeys | None:
    """The role's keys when `network` (a NetworkSection) turns CURVE on; None keeps sockets plaintext."""
    return CurveKeys.load(network.keys_dir) if network.curve_enabled else None


def refusal_counter(counter, socket_name: str, log: logging.Logger):
    """An `on_refusal` for count_refusals: counts into `counter{socket, reason}` and logs the 1st, 2nd, 4th,
    8th ... refusal, so a stranger reconnecting every 100 ms cannot flood the log."""
    refusals = 0

    def refused(reason: str) -> None:
        nonlocal refusals
        counter.labels(socket_name, reason).inc()
        refusals += 1
        if refusals & (refusals - 1) == 0:
            log.warning("refused a peer on the %s socket: CURVE handshake failed (%s); %d refusals so far",
                        socket_name, reason, refusals)
    return refused


async def count_refusals(monitor: zmq.Socket, on_refusal) -> None:
    """Call `on_refusal(reason)` for every refused handshake reported on `monitor` (runs until cancelled)."""
    from zmq.utils.monitor import parse_monitor_message

    while True:
        event = parse_monitor_message(await monitor.recv_multipart())
        reason = REFUSAL_EVENTS.get(event["event"])
        if reason is not None:
            on_refusal(reason)
