"""Two learner checkpoints compared leaf by leaf: every tensor (policy, critic, AdamW moments) with torch.equal,
every other value (version, scheduler, RNG states, SPO tracker) with ==. Either format (learner/checkpoint/):
a single file's model/ safetensors, or a sharded one's dcp/ tensors, plus trainer.pt and tracker.json."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnstream.learner.checkpoint import sharded
from turnstream.learner.checkpoint.layout import read_state

# What each leaf belongs to, by the start of its name. Process RNG: the global torch/numpy/python generators a
# checkpoint saves, from which no step draws (the Trainer's own generator is "generator").
PARTS = (("model/", "weights"), ("dcp/net.model.", "weights"), ("dcp/net.", "critic"), ("trainer/critic", "critic"),
         ("dcp/optimizer", "optimizer"), ("trainer/optimizer", "optimizer"), ("tracker/", "tracker"),
         ("trainer/scheduler", "scheduler"), ("trainer/rng/generator", "generator"), ("trainer/rng/", "process_rng"))


def part_of(name: str) -> str:
    return next((part for prefix, part in PARTS if name.startswith(prefix)), "other")


@dataclass
class Comparison:
    compared: int = 0
    differing: list[str] = field(default_factory=list)  # leaf names, in checkpoint order
    max_abs_diff: float = 0.0  # over the differing tensors
    parts: dict[str, bool] = field(default_factory=dict)  # part -> every leaf of it equal

    @property
    def equal(self) -> bool:
        """Bit for bit, everything a step changes (the process RNG aside: no step draws from it)."""
        return all(ok for part, ok in self.parts.items() if part != "process_rng")

    @property
    def counted_differences(self) -> list[str]:
        """The differing leaves that `equal` counts (the process RNG's are not)."""
        return [n for n in self.differing if part_of(n) != "process_rng"]

    def summary(self) -> str:
        if self.equal:
            return f"equal ({self.compared} leaves: {', '.join(sorted(self.parts))}){self._process_rng_note()}"
        counted = self.counted_differences
        return (f"differs: {len(counted)} of {self.compared} leaves, first {counted[0]}, "
                f"max |diff| {self.max_abs_diff:.3g} (parts differing: "
                f"{', '.join(p for p, ok in sorted(self.parts.items()) if not ok)})")

    def _process_rng_note(self) -> str:
        """Which global generators differ: numpy's and python's are seeded from the OS in every process (nothing
        seeds them, and no step draws from them), so a replay from version 0 holds other states than the run."""
        names = sorted({n.split("/")[2] for n in self.differing if part_of(n) == "process_rng"})
        return f" (the process's {' and '.join(names)} generators differ: no step draws from them)" if names else ""


def compare(run: Path, replayed: Path) -> Comparison:
    a, b = checkpoint_leaves(run), checkpoint_leaves(replayed)
    out = Comparison()
    for name in [*a, *(n for n in b if n not in a)]:
        part = part_of(name)
        same, diff = _same(a.get(name, _MISSING), b.get(name, _MISSING))
        out.compared += 1
        out.parts[part] = out.parts.get(part, True) and same
        if not same:
            out.differing.append(name)
            if part != "process_rng" and diff == diff:  # NaN: not a number to subtract (a string, a missing leaf)
                out.max_abs_diff = max(out.max_abs_diff, diff)
    return out


def checkpoint_leaves(path: Path) -> dict[str, Any]:
    """Every leaf of a checkpoint directory, named by where it sits ("model/<tensor>", "trainer/optimizer/state/0/
    exp_avg", "tracker/state/<prompt key>/0", ...)."""
    path = Path(path)
    leaves: dict[str, Any] = {}
    if sharded.is_sharded(path):
        leaves.update({f"dcp/{k}": t for k, t in _dcp_tensors(path / sharded.DCP_DIR).items()})
    else:
        from safetensors.torch import load_file

        for f in sorted((path / "model").glob("*.safetensors")):
            leaves.update({f"model/{k}": t for k, t in load_file(f).items()})
    trainer_state, tracker_state = read_state(path)
    _flatten("trainer", trainer_state, leaves)
    _flatten("tracker", tracker_state, leaves)
    return leaves


_MISSING = object()


def _same(x, y) -> tuple[bool, float]:
    """(equal, max |difference|: of two tensors of one shape or two numbers; inf for tensors whose shape or dtype
    differ, NaN for anything else)."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if isinstance(y, np.ndarray):
        y = torch.from_numpy(y)
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if torch.equal(x, y):
            return True, 0.0
        return False, float((x.double() - y.double()).abs().max()) if x.numel() else float("inf")
    if x is _MISSING or y is _MISSING or type(x) is not type(y):
        return False, float("nan")
    if x == y:
        return True, 0.0
    return False, abs(x - y) if isinstance(x, (int, float)) else float("nan")


def _flatten(prefix: str, value, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}/{k}", v, out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _flatten(f"{prefix}/{i}", v, out)
    else:
        out[prefix] = value


def _dcp_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a torch.distributed.checkpoint directory, read without a process group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(directory))
    meta = reader.read_metadata().state_dict_metadata
    state = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in meta.items()
             if isinstance(m, TensorStorageMetadata)}
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state
