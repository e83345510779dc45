"""Data parallelism: how several torchrun processes share the training of one model (`train.parallel`).

- ddp: every rank holds the whole model, its gradients and the optimizer state; gradients are all-reduced.
- fsdp: FSDP2's `fully_shard` on each block, then on the root. Each rank keeps 1/world of every parameter, gradient
  and optimizer moment (DTensors sharded on dim 0); a block's parameters are all-gathered just before its forward and
  backward and freed after, and gradients are reduce-scattered. The root unit holds what is left: the token table,
  positions, final norm and the head, so a tied head and table stay one parameter in one unit (as torchtitan does).

One process is the plain model under either choice: there is nothing to replicate or shard.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

if TYPE_CHECKING:
    from model.gpt import GPT
    from train.runtime import Runtime


def ddp_options(rt: Runtime) -> dict:
    """DistributedDataParallel's arguments: this process's GPU, gradients kept as views into the all-reduce buckets
    (no copy in and out of them each step, and no second gradient-sized buffer), and no broadcast of buffers before
    every forward (the model's buffers are fixed tables, the same on every rank)."""
    return {"device_ids": [rt.device.index] if rt.device.type == "cuda" else None,
            "gradient_as_bucket_view": True, "broadcast_buffers": False}


def mixed_precision(rt: Runtime) -> MixedPrecisionPolicy:
    """On CUDA in bf16: parameters all-gathered and computed in bf16 (half the traffic), gradients reduced in fp32
    (a sum over many ranks in bf16 loses digits). Elsewhere the sharded fp32 parameters are used as they are."""
    if rt.device.type == "cuda" and rt.dtype == torch.bfloat16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _broadcast_from_rank0(model: nn.Module) -> None:
    """Every rank starts from rank 0's weights (loaded from a checkpoint there alone), as DDP's constructor does."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def wrap(model: GPT, rt: Runtime, parallel: str = "ddp", compile: bool = False) -> nn.Module:
    """The module the training step calls. `model` is the plain GPT, already on rt.device, with rank 0's weights.

    One process: `model` (compiled when asked). ddp: DDP around it (compiled first). fsdp: `model` itself, sharded
    in place (each block compiled before it is sharded, as torchtitan does), so it stays the object that
    `named_parameters`, `state_dict` and the optimizer see; its parameters become DTensors. Build the optimizer on
    the result's parameters (`unwrap(result)` for ddp), after this call.
    """
    if parallel not in ("ddp", "fsdp"):
        raise ValueError(f"train.parallel: {parallel!r} is not one of ddp, fsdp")
    if not rt.distributed or parallel == "ddp":
        module = torch.compile(model) if compile else model
        return DDP(module, **ddp_options(rt)) if rt.distributed else module
    if rt.dtype == torch.float16:
        raise ValueError("train.dtype: float16 (auto on a GPU without native bf16) cannot run under train.parallel "
                         "fsdp; set train.dtype = \"float32\"")
    _broadcast_from_rank0(model)
    policy = mixed_precision(rt)
    for block in model.blocks:
        if compile:
            block.compile()
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def gradient_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """The context of one micro-step's backward: with `sync` False (every micro-step but the last of an optimizer
    step) gradients only accumulate locally, with no all-reduce (ddp) or reduce-scatter (fsdp)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)  # recurses into the blocks' units
        return contextlib.nullcontext()
    if isinstance(model, DDP) and not sync:
        return model.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global 2-norm is at most `max_norm` (0 = no clipping); returns the norm before
    clipping as a plain tensor. Sharded (DTensor) gradients give the norm of the whole, unsharded gradient: each
    rank's partial norm is combined across ranks before the scale is applied."""
    parameters = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm or float("inf"), total)
    return total
