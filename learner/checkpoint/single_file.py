"""Single-file checkpoints, the format of ddp and one-process learners (learner/checkpoint/layout.py has the
directory conventions):

  model/          save_pretrained (safetensors) + the source model's tokenizer files: loadable by
                  transformers and vLLM as is
  trainer.pt      optimizer, scheduler, critic, RNG states, policy version
  tracker.json    SPO tracker state (plain JSON, readable without torch)

An fsdp2 learner writes each rank's shards instead (learner/checkpoint/sharded.py: `dcp/` in place of the
weights, the same trainer.pt and tracker.json), which any learner resumes from, on any number of ranks;
`turnstream export` turns either into a Hugging Face directory.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from turnstream.learner.checkpoint.layout import final_name, publish, tmp_name


def save(root: Path, version: int, model, source_model_dir: str | Path, trainer_state: dict, tracker_state: dict,
         keep: int = 2) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / final_name(version)
    tmp = root / tmp_name(version, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "model", safe_serialization=True)
    return publish(tmp, final, source_model_dir, trainer_state, tracker_state, keep)
