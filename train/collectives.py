"""What the ranks of a torchrun job say to each other outside the gradient all-reduce.

Every function here is a collective: all ranks call it at the same point, or the job hangs until the process-group
timeout. Each is a no-op (or the identity) in a single process, so the training code calls them unconditionally.
The rule they serve: a failure on one rank becomes the same exception on every rank, never a silent wait.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from data.meta import read_meta
from data.prepare import prepare
from train.config import RunConfig
from train.runtime import Runtime
from train.rng import rng_state

T = TypeVar("T")


def barrier(rt: Runtime) -> None:
    if rt.distributed:
        dist.barrier()


def from_rank0(rt: Runtime, obj: T) -> T:
    """Rank 0's value of `obj` on every rank."""
    if not rt.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def first_error(rt: Runtime, error: str) -> str:
    """The lowest rank's non-empty `error`, on every rank ("" when every rank succeeded)."""
    if not rt.distributed:
        return error
    errors: list = [None] * rt.world_size
    dist.all_gather_object(errors, error)
    return next((e for e in errors if e), "")


def raise_if_any(rt: Runtime, error: str) -> None:
    """Every rank raises the first rank's error (ValueError), so none is left waiting for one that stopped."""
    error = first_error(rt, error)
    if error:
        raise ValueError(error)


def on_rank0(rt: Runtime, job: Callable[[], T], what: str) -> T | None:
    """Run `job` on rank 0 alone; every rank returns its result or raises. Rank 0 re-raises its own exception, the
    others a RuntimeError naming it, instead of waiting in their next collective until the process-group timeout."""
    result, failure, error = None, None, ""
    if rt.is_main:
        try:
            result = job()
        except Exception as e:  # noqa: BLE001 - whatever it is, the other ranks must hear of it
            failure, error = e, f"rank 0 failed while {what}: {type(e).__name__}: {e}"
    error = from_rank0(rt, error)  # also the barrier after rank 0's work
    if failure is not None:
        raise failure
    if error:
        raise RuntimeError(error)
    return result


def checked_on_rank0(rt: Runtime, job: Callable[[], T]) -> T | None:
    """Run `job` on rank 0 alone; its ValueError (bad input: a one-line message) is raised on every rank."""
    result, error = None, ""
    if rt.is_main:
        try:
            result = job()
        except ValueError as e:
            error = str(e)
    raise_if_any(rt, error)
    return result


def agree(rt: Runtime, flag: bool, elapsed: float) -> tuple[bool, float]:
    """All ranks take the same stop decision and the same clock (the slowest's), so their loops stay in step
    and a time-based LR schedule gives every replica the same LR."""
    if not rt.distributed:
        return flag, elapsed
    t = torch.tensor([1.0 if flag else 0.0, elapsed], dtype=torch.float64, device=_comm_device(rt))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t[0].item() > 0), float(t[1].item())


def mean_over_ranks(rt: Runtime, values: torch.Tensor) -> torch.Tensor:
    """The ranks' average of `values`, in place (gloo has no AVG reduction: SUM, then divide)."""
    if rt.distributed:
        if rt.device.type == "cuda":
            dist.all_reduce(values, op=dist.ReduceOp.AVG)
        else:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            values /= rt.world_size
    return values


def gather_rng(rt: Runtime) -> list[dict] | None:
    """Every rank's RNG state, for rank 0's checkpoint; None in a single process (its own state is saved anyway)."""
    if not rt.distributed:
        return None
    states: list = [None] * rt.world_size
    dist.all_gather_object(states, rng_state(rt.device))
    return states


def same_data_on_every_node(cfg: RunConfig, rt: Runtime) -> None:
    """After rank 0 prepared: a node whose data.dir is missing or differs (no shared filesystem, or a stale copy)
    prepares its own from the same source, and must end up with rank 0's text and settings."""
    if not rt.distributed:
        return
    want = from_rank0(rt, _data_identity(cfg.data.dir))
    error = ""
    if rt.local_rank == 0 and not rt.is_main and _data_identity(cfg.data.dir) != want:
        try:
            prepare(cfg.data, verbose=False)
            if _data_identity(cfg.data.dir) != want:
                source = cfg.data.path or cfg.data.source
                error = f"data.dir: rank {rt.rank} prepared other text than rank 0 from {source}; nodes need the same"
        except ValueError as e:
            error = f"rank {rt.rank}: {e}"
    raise_if_any(rt, error)


def _data_identity(folder: str) -> tuple[Any, Any] | None:
    try:
        meta = read_meta(folder)
    except ValueError:
        return None
    return meta["text_sha256"], meta.get("config")


def _comm_device(rt: Runtime) -> torch.device | str:
    """NCCL reduces CUDA tensors only; gloo CPU ones."""
    return rt.device if rt.device.type == "cuda" else "cpu"
