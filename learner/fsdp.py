"""FSDP2 for the learner (`learner.parallel = "fsdp2"`): parameters, gradients and AdamW state sharded over ranks.

Each decoder layer is its own FSDP unit, so a forward or backward holds one layer's full parameters at a time
(all-gathered just before it runs, freed after); the model root holds what is left (embeddings, final norm,
LM head, which stay together so tied embeddings share one parameter). The separate critic's backbone is
sharded the same way, and the network root (learner/critic.py's PolicyAndValue) takes the shared value head.

Every forward all-gathers, so every rank must run the same number of forwards (learner/trainer.py gives an
idle rank stand-in micro-batches). No rank holds the full weights: a push gathers them bucket by bucket
(learner/weight_sync_buckets.py) and a checkpoint writes each rank's shards (learner/checkpoint_dcp.py).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger("turnstream.learner")


def sharded(parallel: str, world: int) -> bool:
    """Whether the learner shards: fsdp2 asked for and more than one rank (one rank has nothing to shard with)."""
    if parallel == "fsdp2" and world == 1:
        log.info("learner.parallel = fsdp2 with one process: training unsharded (start it with torchrun "
                 "--nproc-per-node N to shard)")
    return parallel == "fsdp2" and world > 1


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face causal LM: the classes it names as never to be split."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        from turnstream.core.configtools import ConfigError

        raise ConfigError(f"learner.parallel: fsdp2 found no decoder layers in {type(model).__name__} "
                          "(it shards the classes in its _no_split_modules); use ddp for this model")
    return layers


def _options(device: torch.device, compute_dtype: torch.dtype | None) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import torch.distributed as dist

    kw = {"mesh": init_device_mesh(device.type, (dist.get_world_size(),))}
    if device.type == "cuda" and compute_dtype is not None:
        # layers compute on bf16 copies of their gathered parameters; gradients are reduced in fp32 and the
        # sharded master weights and AdamW moments stay fp32 (learner/device.py explains why fp32 masters)
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    return kw


def shard_model(model: nn.Module, options: dict, reshard_after_forward: bool = True) -> None:
    """fully_shard per decoder layer, then the model itself (in place). `reshard_after_forward`: whether a
    layer frees its gathered parameters between its forward and its backward (learner.reshard_after_forward)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **options)
    fully_shard(model, **options)


def shard_network(net: nn.Module, device: torch.device, compute_dtype: torch.dtype | None,
                  ref_model: nn.Module | None = None, reshard_after_forward: bool = True) -> None:
    """Shard the policy, the separate critic if any, and the network root (value head) in place; the frozen
    reference model is sharded too (no gradients, no optimizer state: its parameters alone)."""
    from torch.distributed.fsdp import fully_shard

    options = _options(device, compute_dtype)
    shard_model(net.model, options, reshard_after_forward)
    if getattr(net, "critic", None) is not None:
        shard_model(net.critic.backbone, options, reshard_after_forward)
    fully_shard(net, **options)
    if ref_model is not None:
        shard_model(ref_model, _options(device, None))  # held in the compute dtype already


def reshard(net: nn.Module) -> None:
    """Free every unit's gathered parameters. The root keeps its own gathered after a forward without a backward
    (the passes without gradients), which would hold the embeddings and LM head in full and leave the module
    registering plain tensors instead of the sharded parameters that the optimizer and state dicts know."""
    from torch.distributed.fsdp import FSDPModule

    for m in net.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def set_gradient_sync(net: nn.Module, enabled: bool) -> None:
    """Gradients reduce-scatter in the next backward only if `enabled`; otherwise they accumulate unreduced on
    the rank (FSDP2's no_sync), so a rank's micro-batches cost one reduction per optimizer step."""
    net.set_requires_gradient_sync(enabled)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """clip_grad_norm_ that also takes sharded (DTensor) gradients: the norm of a shard is partial, so the
    total is reduced over ranks before the clip coefficient is applied; plain tensors take the same path."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def load_full_state_dict(module: nn.Module, state: dict) -> None:
    """Each rank keeps its shards of a full (unsharded) state that every rank has read, e.g. a single-file
    checkpoint's critic; on plain tensors, a plain load."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True))


def load_full_optimizer_state_dict(net: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """As load_full_state_dict, for AdamW's state keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(net, optimizer, state, options=StateDictOptions(full_state_dict=True))


def state_bytes(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (a shard's local part only)."""
    def local(t) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    out = {"params": sum(local(p) for p in params),
           "grads": sum(local(p.grad) for p in params if p.grad is not None),
           "optimizer": sum(local(v) for s in optimizer.state.values() for v in s.values()
                            if isinstance(v, torch.Tensor))}
    out["total"] = sum(out.values())
    return out
