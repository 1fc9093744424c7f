"""Questions the tests ask of the metric catalogue (turnstream/reference/metrics.py)."""
from __future__ import annotations

from turnstream.core import build_info
from turnstream.reference.metrics import catalogue, registry_specs, role_registries


def roles_with_build_info() -> set[str]:
    """Roles whose metric class registers the build-info gauge itself (so a live scrape must show it)."""
    return {role for role, registry in role_registries().items()
            if any(s.name == build_info.NAME for s in registry_specs(role, registry))}


def all_series_names() -> set[str]:
    """Every series name a query can use: counters with _total, histograms with _bucket/_sum/_count."""
    out = set()
    for spec in catalogue():
        out.add(spec.name)
        if spec.type in ("histogram", "summary"):
            out |= {f"{spec.name}_sum", f"{spec.name}_count"}
        if spec.type == "histogram":
            out.add(f"{spec.name}_bucket")
    return out
