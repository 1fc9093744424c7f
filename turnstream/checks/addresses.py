"""At a role's start, before it binds or connects anything: every address it binds belongs to this host, and
the name of every peer it connects to resolves here. ZeroMQ would answer the first with a traceback
(`Cannot assign requested address`) and the second not at all: a connect to a name that never resolves is
retried in silence for ever. Each is a ConfigError naming the setting instead. A peer whose name resolves
but that does not answer yet is no error: roles start in any order and wait for each other.

Only the buffer's name must resolve at start (for the learner and the actors): every deployment starts the
buffer first or names it by an address that outlives it (a Kubernetes Service, compose's `depends_on`, the
Slurm template's addresses). The learner's name may not exist yet when the buffer or an actor starts (a
compose service's name resolves once its container runs, and the learner's waits for a healthy buffer), so
that one is a warning naming the setting, and the role goes on.
"""
from __future__ import annotations

import logging
import socket

from turnstream.core.config import Config
from turnstream.core.config_network import is_wildcard
from turnstream.core.configtools import ConfigError

log = logging.getLogger("turnstream.checks.addresses")


def check_role_addresses(cfg: Config, role: str) -> None:
    """`role`: buffer, learner or actor. Raises ConfigError for the first address that cannot work."""
    net = cfg.network
    # (setting, host): the setting a user fixes is the one that gave the host, `host` when the other is empty
    listen = ("network.bind_host" if net.bind_host else "network.host", net.listen_host)
    buffer = ("network.buffer_host" if net.buffer_host else "network.host", net.buffer_address)
    learner = ("network.learner_host" if net.learner_host else "network.host", net.learner_address)
    binds, required, later = [listen], [], []  # later: peers whose name may only exist once they run
    if role == "buffer" and net.learner_pub_port:  # it follows the learner's version announcements
        later.append(learner)
    elif role == "learner":
        required.append(buffer)
    elif role == "actor":
        binds.append(("actor.endpoint_bind_host", cfg.actor.endpoint_bind_host))
        required.append(buffer)
        if cfg.tasks.order == "spo":
            later.append(learner)
        cfg.actor.endpoint_url_host(net)  # the agents' base URLs name an address they can connect to
    for setting, host in binds:
        if problem := bind_problem(host):
            raise ConfigError(f"{setting}: {problem}")
    for setting, host in required:
        if problem := resolve_problem(host):
            raise ConfigError(f"{setting}: {problem}")
    for setting, host in later:
        if problem := resolve_problem(host):
            log.warning("%s: %s; going on, as the peer may not have started yet", setting, problem)


def bind_problem(host: str) -> str:
    """Why a socket cannot bind `host` on this machine (no interface has that address); "" when it can."""
    if is_wildcard(host):
        return ""
    try:
        candidates = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{host} does not resolve here ({exc.strerror}), so it cannot be bound"
    failure = ""
    for family, kind, proto, _, address in candidates:
        with socket.socket(family, kind, proto) as sock:
            try:
                sock.bind(address)  # port 0: only the address is tried; nothing listens
                return ""
            except OSError as exc:
                failure = exc.strerror or str(exc)
    return f"cannot bind {host} on this host ({failure}): no interface here has that address"


def resolve_problem(host: str) -> str:
    """Why this host cannot even look up the peer `host`; "" when the name resolves (an address always does)."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"{host} does not resolve here ({exc.strerror}); name the peer's address or a name this host resolves"
    return ""
