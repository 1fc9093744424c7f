"""`turnstream_build_info{version, role, python}` = 1 on a role's registry.

Prometheus' convention for build metadata: a constant gauge whose labels carry the facts, so a dashboard can
join on it (`* on(instance) group_left(version) turnstream_build_info`) and an alert can spot mixed versions
in one run. No git SHA: deployed images carry no checkout, and the package version is what users install.
"""
from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge

import turnstream

NAME = "turnstream_build_info"
HELP = "Always 1; labels name the turnstream version, the role of the process and the Python version"
LABELS = ("version", "role", "python")
ROLES = ("launcher", "buffer", "learner", "actor")


def register_build_info(registry: CollectorRegistry, role: str) -> Gauge:
    """Add the build-info gauge for `role` to `registry` (each role has its own registry)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    gauge = Gauge(NAME, HELP, LABELS, registry=registry)
    gauge.labels(turnstream.__version__, role, platform.python_version()).set(1)
    return gauge
