"""Sharded checkpoints (`learner.parallel = "fsdp2"`): each rank writes its own shards (torch.distributed.checkpoint).

Layout of <run_dir>/checkpoints/step-000012/ (learner/checkpoint/single_file.py has the single-file one,
learner/checkpoint/layout.py the conventions both share):
  dcp/            torch.distributed.checkpoint: `net.*` (policy `net.model.*`, value head or separate critic)
                  and `optimizer.*` (AdamW moments, keyed by parameter name), each rank's shards
  model/          the source model's config and tokenizer files, no weights (`turnstream export` adds them)
  trainer.pt      version, scheduler, RNG states, the writer's learner.parallel
  tracker.json    SPO tracker state
Writing is a collective: every rank writes its shards into the same `.tmp-*` directory (a filesystem every
rank sees: one machine, or shared storage across nodes), then rank 0 completes it and renames it into place,
as a single-file checkpoint is published, so `latest()` and pruning are the same. Reading is a collective too, and
reshards: a checkpoint written on N ranks loads on M (torch.distributed.checkpoint plans the reads from the
saved shards' offsets), also into a one-process learner whose tensors are plain.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch.distributed as dist

from turnstream.learner.checkpoint.layout import final_name, publish, read_state
from turnstream.learner.checkpoint.trainer_state import load_sharded_state, meta_state, sharded_state

DCP_DIR = "dcp"
POLICY_PREFIX = "net.model."  # the policy's keys in dcp/: net.model.<Hugging Face name>


def is_sharded(path: Path) -> bool:
    return (Path(path) / DCP_DIR).is_dir()


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save(root: Path, trainer, source_model_dir: str | Path, tracker_state: dict, keep: int, tmp: str) -> Path | None:
    """On every rank (collective); rank 0 returns the published directory, the other ranks None."""
    import torch.distributed.checkpoint as dcp

    root, final = Path(root), Path(root) / final_name(trainer.version)
    if trainer.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(root / tmp, ignore_errors=True)
    _barrier()  # nobody writes into a directory rank 0 is still clearing
    dcp.save(sharded_state(trainer), checkpoint_id=root / tmp / DCP_DIR)  # fsyncs each rank's files
    if trainer.rank != 0:
        return None
    return publish(root / tmp, final, source_model_dir, meta_state(trainer), tracker_state, keep)


def model_to_fill(model_dir: str | Path, **kwargs):
    """The causal LM of `model_dir`'s config, its weights neither read nor initialised (kwargs: from_config's,
    e.g. attn_implementation). A sharded resume overwrites every weight from dcp/ (load: strict), so reading
    `model.path`'s first would be a wasted full load; the non-persistent buffers (rotary frequencies), which
    dcp/ does not hold, are computed as the model is built. fp32 and eval mode, as from_pretrained gives."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32,
                                                 **kwargs)
    model.tie_weights()  # no_init_weights also skips the tying that init_weights does
    return model.eval()


def load(path: Path, trainer) -> None:
    """Weights, critic, AdamW state, scheduler, RNG and tracker of `path` into `trainer` (collective), whatever
    the number of ranks that wrote it."""
    import torch.distributed.checkpoint as dcp

    state = sharded_state(trainer)  # the structure to fill: this learner's own shards
    dcp.load(state, checkpoint_id=Path(path) / DCP_DIR)
    load_sharded_state(trainer, state, *read_state(path))
