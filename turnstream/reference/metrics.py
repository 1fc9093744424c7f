"""The metric catalogue, generated from the code: every role's metric classes on fresh registries.

`python -m turnstream.reference.metrics --write` regenerates docs/metrics.md; a unit test fails when the file
and the code disagree, so the catalogue cannot drift. `lint_metric` and `lint_exposition` hold the naming
rules (Prometheus conventions, see docs/metrics.md) for the catalogue and for live scrapes alike.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from turnstream.core import build_info

ROLES = ("launcher", "buffer", "learner", "actor")
DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

# Name words that are units. A histogram must end in one; the catalogue's unit column is the last one found.
UNITS = {
    "seconds": "seconds", "bytes": "bytes", "ratio": "ratio", "fraction": "ratio",
    "version": "versions", "versions": "versions", "tokens": "tokens", "episodes": "episodes",
    "chunks": "chunks", "turns": "turns", "steps": "steps", "batches": "batches", "acks": "acks",
    "messages": "messages", "credits": "credits", "actors": "actors", "requests": "requests",
    "processes": "processes", "resends": "chunks", "failures": "events", "errors": "events",
    "retries": "events", "starts": "events", "groups": "groups",
    "values": "1",  # figures whose unit only their source knows (an environment's Step.info numbers)
}
# Non-base units (Prometheus wants seconds, bytes and 0-1 ratios) and abbreviations such as `push_s`.
NON_BASE_UNITS = {"s", "sec", "secs", "ms", "millis", "milliseconds", "us", "usec", "microseconds", "ns",
                  "nanoseconds", "min", "mins", "minutes", "hours", "days", "kb", "mb", "gb", "kib", "mib", "gib",
                  "kilobytes", "megabytes", "gigabytes", "percent", "pct"}
TIME_WORDS = {"duration", "latency", "delay", "elapsed", "uptime", "timestamp", "time", "age"}
# Label names whose values grow without bound (one series per episode, prompt, request...). Prometheus
# already adds `instance` per scrape target, so per-process ids are not labels either.
UNBOUNDED_LABELS = {"episode", "episode_id", "prompt", "prompt_id", "prompt_key", "request_id", "seq", "chunk_id",
                    "actor_id", "worker_id", "pid", "epoch", "user", "user_id", "trace_id", "id", "uuid", "token",
                    "text", "message"}
RESERVED_LABELS = {"le", "quantile", "job", "instance"}
NAME_RE = re.compile(r"^turnstream_[a-z][a-z0-9]*(_[a-z0-9]+)+$")
LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")
MAX_SERIES_PER_FAMILY = 200  # a live family above this many label sets has an unbounded label in practice
MAX_LABEL_VALUE_CHARS = 128

# Known deviations from the rules in code owned by other roles, each with the fix. A test checks that every
# entry still exists, so fixing the code forces removing the entry (and the exception).
KNOWN_DEVIATIONS: dict[str, str] = {}


@dataclass(frozen=True)
class MetricSpec:
    role: str  # "all" for the build-info gauge every role carries
    name: str  # as exposed: counters with their _total suffix; histograms without _bucket/_sum/_count
    type: str
    labels: tuple[str, ...]
    help: str

    @property
    def unit(self) -> str:
        return unit_of(self.name)

    @property
    def family(self) -> str:
        """The name Prometheus' text parser reports (counters without _total)."""
        return self.name[: -len("_total")] if self.type == "counter" and self.name.endswith("_total") else self.name


def unit_of(name: str) -> str:
    words = name.removesuffix("_total").split("_")[1:]
    for word in reversed(words):
        if word in UNITS:
            return UNITS[word]
    return "1"  # dimensionless: losses, KL, entropy, norms, 0/1 flags


def role_registries() -> dict[str, CollectorRegistry]:
    """Each role's metrics on a registry of its own, exactly as the role creates them."""
    from turnstream.actors.metrics import ActorMetrics
    from turnstream.actors.play.endpoint.metrics import AgentMetrics
    from turnstream.buffer.metrics import BufferMetrics
    from turnstream.launch.metrics import LauncherMetrics
    from turnstream.learner.metrics import LearnerMetrics

    actor = ActorMetrics(CollectorRegistry()).registry
    AgentMetrics(actor)  # registered on the actor's registry by its first endpoint episode (actors/play/endpoint/)
    return {
        "launcher": LauncherMetrics(SimpleNamespace(children=[])).registry,  # type: ignore[arg-type]
        "buffer": BufferMetrics(CollectorRegistry()).registry,
        "learner": LearnerMetrics(CollectorRegistry()).registry,
        "actor": actor,
    }


def registry_specs(role: str, registry: CollectorRegistry) -> list[MetricSpec]:
    # Label names live on the metric objects, not in collect(): a labelled metric with no children yet
    # exposes no samples. The registry's collector table is private API, but stable since client 0.4.
    specs = []
    for collector in list(registry._collector_to_names):  # noqa: SLF001
        name, kind = getattr(collector, "_name", None), getattr(collector, "_type", None)
        if name is None or kind is None:  # a custom collector (buffer.metrics.IngestCounts): what it describes
            described = [(f.name, f.type, sorted({k for s in f.samples for k in s.labels}), f.documentation)
                         for f in collector.describe()]
        else:
            described = [(name, kind, collector._labelnames, collector._documentation)]  # noqa: SLF001
        for name, kind, labels, help_text in described:
            exposed = f"{name}_total" if kind == "counter" else name
            specs.append(MetricSpec(role, exposed, kind, tuple(labels), help_text))
    return specs


def catalogue() -> list[MetricSpec]:
    """Every metric of every role; the build-info gauge once, as role "all"."""
    out = [MetricSpec("all", build_info.NAME, "gauge", build_info.LABELS, build_info.HELP)]
    for role, registry in role_registries().items():
        out += sorted((s for s in registry_specs(role, registry) if s.name != build_info.NAME), key=lambda s: s.name)
    return out


def names_by_role() -> dict[str, set[str]]:
    """Family names (as a scrape parser reports them) each role may expose, build info included."""
    out: dict[str, set[str]] = {role: {build_info.NAME} for role in ROLES}
    for spec in catalogue():
        if spec.role != "all":
            out[spec.role].add(spec.family)
    return out


def lint_metric(name: str, kind: str, labels: tuple[str, ...] | list[str], help_text: str = "x") -> list[str]:
    """Problems with one metric's name, type and label names (empty list: it follows the conventions)."""
    problems = []
    if not NAME_RE.match(name):
        problems.append("name is not snake_case with the turnstream_ prefix")
    words = name.split("_")
    if kind == "counter" and not name.endswith("_total"):
        problems.append("counter does not end in _total")
    if kind != "counter" and name.endswith("_total"):
        problems.append(f"{kind} ends in _total (reserved for counters)")
    bad_units = NON_BASE_UNITS.intersection(words)
    if bad_units:
        problems.append(f"non-base or abbreviated unit {sorted(bad_units)} (use seconds, bytes, ratio)")
    if kind in ("histogram", "summary") and words[-1] not in UNITS:
        problems.append(f"{kind} name does not end in a unit ({', '.join(sorted(set(UNITS.values())))})")
    if TIME_WORDS.intersection(words) and "seconds" not in words:
        problems.append("a time quantity not in seconds")
    if not help_text.strip():
        problems.append("empty help text")
    for label in labels:
        if not LABEL_RE.match(label):
            problems.append(f"label {label!r} is not snake_case")
        if label in UNBOUNDED_LABELS:
            problems.append(f"label {label!r} is unbounded")
        if label in RESERVED_LABELS:
            problems.append(f"label {label!r} is reserved by Prometheus")
        if f"_by_{label}" in name:
            problems.append(f"label name {label!r} repeated in the metric name")
    return problems


def lint_catalogue(specs: list[MetricSpec] | None = None) -> dict[str, list[str]]:
    out = {}
    for spec in specs if specs is not None else catalogue():
        problems = lint_metric(spec.name, spec.type, spec.labels, spec.help)
        if problems:
            out[spec.name] = problems
    return out


def lint_exposition(text: str, role: str | None = None) -> dict[str, list[str]]:
    """Lint a live /metrics body: names, label sets, label-value cardinality, and (given the role) that
    every family is in the catalogue."""
    from prometheus_client.parser import text_string_to_metric_families

    known = names_by_role()[role] if role else None
    out: dict[str, list[str]] = {}
    families = list(text_string_to_metric_families(text))
    # The 0.0.4 text format carries a counter's or histogram's creation time as a separate `<name>_created`
    # gauge family; it belongs to its parent, not to the catalogue.
    with_created = {f.name for f in families if f.type in ("counter", "histogram", "summary")}
    for family in families:
        if family.name.endswith("_created") and family.name.removesuffix("_created") in with_created:
            continue
        exposed = f"{family.name}_total" if family.type == "counter" else family.name
        label_sets = {tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("le", "quantile")))
                      for s in family.samples if not s.name.endswith("_created")}
        labels = sorted({k for ls in label_sets for k, _ in ls})
        problems = lint_metric(exposed, family.type, labels, family.documentation)
        if len(label_sets) > MAX_SERIES_PER_FAMILY:
            problems.append(f"{len(label_sets)} label sets (more than {MAX_SERIES_PER_FAMILY})")
        for ls in label_sets:
            for k, v in ls:
                if len(v) > MAX_LABEL_VALUE_CHARS or re.fullmatch(r"[0-9a-f-]{16,}", v):
                    problems.append(f"label {k}={v[:40]!r} looks like an unbounded id")
        if known is not None and family.name not in known:
            problems.append(f"not in the {role} catalogue (regenerate docs/metrics.md)")
        if problems:
            out[exposed] = problems
    return out


def render_markdown() -> str:
    specs = catalogue()
    lines = [
        "# Metric catalogue",
        "",
        "Generated from the code by `python -m turnstream.reference.metrics --write`; "
        "`tests/unit/test_metrics_catalogue.py` fails when this file is out of date.",
        "",
        "Every role (launcher, buffer, learner, each actor) serves these on its own `/metrics` (Prometheus text) "
        "next to `/healthz` (JSON). Prometheus adds `job` and `instance` per target; the launcher's discovery "
        "files add `role` and `run` (see `deploy/prometheus/`). vLLM servers expose vLLM's own `vllm:*` metrics "
        "on their HTTP port and are scraped as a job of their own; they are not listed here.",
        "",
        "Naming rules (checked by `lint_metric` for this catalogue and for live scrapes): snake_case with the "
        "`turnstream_` prefix; base units in the name (`_seconds`, `_bytes`, ratios 0-1); counters end in "
        "`_total`; histograms end in their unit; labels have bounded value sets (no episode, prompt or request "
        "ids; no per-process ids, which `instance` already provides). Units in the table come from the name; "
        "`1` means dimensionless.",
        "",
    ]
    titles = {"all": "Every role", "launcher": "Launcher (`turnstream up`, `turnstream demo`)",
              "buffer": "Buffer", "learner": "Learner", "actor": "Actor"}
    for role in ("all", *ROLES):
        rows = [s for s in specs if s.role == role]
        lines += [f"## {titles[role]}", "", "| metric | type | labels | unit | meaning |", "|---|---|---|---|---|"]
        for s in rows:
            labels = ", ".join(f"`{label}`" for label in s.labels) or "-"
            lines.append(f"| `{s.name}` | {s.type} | {labels} | {s.unit} | {s.help.replace('|', '/')} |")
        lines.append("")
    if KNOWN_DEVIATIONS:
        lines += ["## Known deviations", ""]
        lines += [f"- `{name}`: {why}" for name, why in sorted(KNOWN_DEVIATIONS.items())]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turnstream.reference.metrics", description=__doc__)
    p.add_argument("--write", action="store_true", help=f"write {DOC_PATH.relative_to(DOC_PATH.parents[1])}")
    p.add_argument("--check", action="store_true", help="exit 1 if the file is out of date or a name breaks a rule")
    args = p.parse_args(argv)
    text = render_markdown()
    if args.write:
        DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
        DOC_PATH.write_text(text)
    elif args.check:
        problems = {k: v for k, v in lint_catalogue().items() if k not in KNOWN_DEVIATIONS}
        stale = not DOC_PATH.exists() or DOC_PATH.read_text() != text
        for name, why in problems.items():
            print(f"{name}: {'; '.join(why)}", file=sys.stderr)
        if stale:
            print(f"{DOC_PATH} is out of date: run python -m turnstream.reference.metrics --write", file=sys.stderr)
        return 1 if problems or stale else 0
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
