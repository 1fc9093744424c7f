"""FSDP2 for the learner (`learner.parallel = "fsdp2"`): parameters, gradients and AdamW state sharded over ranks.

Each decoder layer is its own FSDP unit, so a forward or backward holds one layer's full parameters at a time
(all-gathered just before it runs, freed after); the model root holds what is left (embeddings, final norm,
LM head, which stay together so tied embeddings share one parameter). The separate critic's backbone is
sharded the same way, and the network root (learner/estimators/critic.py's PolicyAndValue) takes the shared
value head.

Every forward all-gathers, so every rank must run the same number of forwards: a rank with fewer micro-batches
runs stand-ins (`forwards`). Gradients are summed by a reduce-scatter of the sharded gradients, once per
optimizer step (a rank's other micro-batches accumulate unreduced). No rank holds the full weights: a push
gathers them bucket by bucket (learner/weights/buckets.py) and a checkpoint writes each rank's shards
(learner/checkpoint/sharded.py).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from turnstream.core.config_lora import LoraSection
from turnstream.learner.parallel.strategy import ParallelStrategy
from turnstream.learner.weights.buckets import WeightBuckets
from turnstream.learner.weights.source import push_source


class FullySharded(ParallelStrategy):
    """FSDP2 over the torchrun ranks: no rank holds the full weights, gradients or AdamW state."""

    collective_push = True  # every read of the weights gathers shards

    def place(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=torch.float32)  # fully_shard moves each rank's shards to the device

    def prepare(self, net: nn.Module, ref_model: nn.Module | None, reshard_after_forward: bool) -> nn.Module:
        # sharding replaces the parameters with DTensor ones: before the optimizer is built
        shard_network(net, self.device, self.where.compute_dtype, ref_model, reshard_after_forward)
        return net

    def gradient_sync(self, train_net: nn.Module, last: bool) -> contextlib.AbstractContextManager:
        # gradients reduce-scatter in the backward of the rank's last micro-batch only; before it they
        # accumulate unreduced on the rank (FSDP2's no_sync)
        train_net.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def forwards(self, groups: int, mine: int) -> int:
        return -(-groups // self.world)  # the busiest rank's count: each forward all-gathers, a collective

    def end_step(self, net: nn.Module) -> None:
        reshard(net)  # the root keeps its gathered parameters after the no-grad pass: the shards again

    def push_source(self, model: nn.Module, lora: LoraSection | None, dtype: torch.dtype | None, bucket_bytes: int,
                    announce: Callable[[Path | None], None] | None = None) -> WeightBuckets:
        return push_source(model, lora, dtype, bucket_bytes, announce)

    def file_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        raise RuntimeError("fsdp2 state is sharded: write it with learner/checkpoint/sharded.py")

    def load_optimizer_state(self, net: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
        """From a ddp or one-process checkpoint (every rank read it): AdamW's state, kept there by parameter
        index, is keyed by name (both learners build their parameter groups in the same order), and each rank
        keeps its shards of it."""
        names = {id(p): n for n, p in net.named_parameters()}
        order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
        named = {"state": {order[int(i)]: s for i, s in saved["state"].items()},
                 "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]]}
        load_full_optimizer_state_dict(net, optimizer, named)

    def load_critic_state(self, net: nn.Module, state: dict | None) -> None:
        critic = net.critic_module()
        if critic is not None and state:  # each rank keeps its shards
            load_full_state_dict(critic, state)


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
    if net.critic is not None:
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


def load_full_state_dict(module: nn.Module, state: dict) -> None:
    """Each rank keeps its shards of a full (unsharded) state that every rank has read, e.g. a single-file
    checkpoint's critic; on plain tensors, a plain load."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True))


def load_full_optimizer_state_dict(net: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """As load_full_state_dict, for AdamW's state keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(net, optimizer, state, options=StateDictOptions(full_state_dict=True))
