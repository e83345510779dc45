"""Checkpoints of sharded (fsdp) runs, and resuming any checkpoint under any parallelism and world size.

On disk, a checkpoint directory (`latest/`) of an fsdp run is today's plus one folder:

    model.safetensors   the consolidated full weights (tied head stored once), gathered onto rank 0: what
                        sample, evaluate, attention, convert and serve read, unchanged
    config.json, tokenizer.json
    trainer_state.pt    step, progress, RNG streams (`rng_ranks`), scaler, as today, but no "optimizer" entry:
                        instead "optimizer_dir": "sharded"
    sharded/            torch.distributed.checkpoint (dcp) folder of {"model": ..., "optimizer": ...}:
      .metadata         written by rank 0 once every rank's shards are down; maps each tensor's pieces to files
      __R_0.distcp      rank R's shards: its rows of every parameter and of both AdamW moments

The optimizer state in `sharded/` is keyed by parameter name (torch.distributed.checkpoint.state_dict's FQN-keyed
form) and stored as pieces of global tensors, so dcp reshards it on load for any world size. A ddp or one-process
checkpoint keeps its optimizer state in trainer_state.pt as `optimizer.state_dict()` (keyed by position); moving
between the two forms goes through the FQN-keyed full state (`restore`).

Atomic as every checkpoint: all ranks write into the hidden `.latest.tmp-*` twin that rank 0 created, rank 0 adds
the consolidated weights and the small files, checks that every shard the metadata names is on disk, and swaps the
folder in (data/atomic.py's `staging_dir` and `swap_in`, the two halves of `atomic_dir`). A rank killed mid-save leaves the previous
checkpoint in place; a rank that fails makes every rank raise, and the twin is removed.

An fsdp checkpoint needs `train.out_dir` on a filesystem every node sees (each rank writes its own shard into it);
without one, the save stops with a one-line error rather than leave a checkpoint that cannot be loaded. `sharded/`
is trusted input: dcp unpickles its metadata. model.safetensors stays the safe way to pass a model on.
"""
from __future__ import annotations

import shutil
import warnings
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, get_state_dict,
                                                     set_optimizer_state_dict, set_state_dict)

from data.atomic import staging_dir, swap_in
from data.tokenizers import Tokenizer
from model.checkpoint import weights_to_store, write_checkpoint_files
from train.collectives import first_error, from_rank0
from train.parallel import is_sharded
from train.runtime import Runtime

SHARDED = "sharded"
FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (other ranks get {}); a collective under fsdp. For a plain
    model on the CPU the tensors are the live parameters, not copies."""
    return get_model_state_dict(model, options=FULL_ON_RANK0)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state keyed by parameter name, whole tensors on rank 0's CPU (others get {}); a collective
    under fsdp. The form both checkpoint layouts convert through. Live tensors, as above, for a plain model."""
    return get_optimizer_state_dict(model, optimizer, options=FULL_ON_RANK0)


def save_sharded_checkpoint(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                            tokenizer: Tokenizer, run_config: dict, trainer_state: dict[str, Any] | None,
                            rt: Runtime) -> Path:
    """Every rank calls this at the same step (it is a collective). With `trainer_state` (a resumable checkpoint,
    `latest/`) the sharded model and optimizer go to `sharded/` as well; without (`best/`) only the consolidated
    weights are written. Returns the final directory; raises on every rank if any rank failed."""
    final = Path(directory)
    tmp = Path(from_rank0(rt, str(staging_dir(final)) if rt.is_main else None))
    error = ""
    try:
        if trainer_state is not None:
            if optimizer is None:
                raise ValueError("a resumable checkpoint needs the optimizer")
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp / SHARDED)
        full = full_model_state(model)
        if rt.is_main:
            state = None
            if trainer_state is not None:
                _check_complete(tmp / SHARDED)
                state = {k: v for k, v in trainer_state.items() if k != "optimizer"} | {"optimizer_dir": SHARDED}
            write_checkpoint_files(tmp, weights_to_store(full, model.config.tie_embeddings), tokenizer, run_config,
                                   state)
            swap_in(tmp, final)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - every rank must hear of it, then it is raised
        error = _describe(e, rt.rank)
    failed = first_error(rt, error)
    if failed:
        if rt.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"saving {final} failed ({failed}); the previous checkpoint stays")
    return final


def _describe(e: BaseException, rank: int) -> str:
    """One line for what failed where; dcp's CheckpointException (a BaseException) carries each failed rank's own."""
    if isinstance(e, CheckpointException) and e.failures:
        rank, (e, _) = next(iter(sorted(e.failures.items())))
    return f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _check_complete(folder: Path) -> None:
    """Every file the dcp metadata names is in `folder` with its bytes: it is not when ranks on other nodes wrote
    their shards into folders of their own (no shared filesystem)."""
    metadata = FileSystemReader(str(folder)).read_metadata()
    need: dict[str, int] = {}
    for info in metadata.storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    short = [name for name, size in need.items()
             if not (folder / name).is_file() or (folder / name).stat().st_size < size]
    if short:
        raise ValueError(f"train.out_dir: {len(short)} of {len(need)} shard files (e.g. {sorted(short)[0]}) are not "
                         f"in {folder}; fsdp checkpoints need out_dir on a filesystem every node shares")


def is_sharded_checkpoint(trainer_state: dict[str, Any]) -> bool:
    return trainer_state.get("optimizer_dir") == SHARDED


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any],
            directory: str | Path | None, rt: Runtime) -> None:
    """Load a checkpoint's optimizer state into `optimizer` (built on `model`, after `wrap`), whichever layout
    saved it and however many processes did; a sharded model also reloads its weights from the shards.

    `trainer_state` is the checkpoint's trainer_state.pt (for a plain checkpoint with its "optimizer", on rank 0
    at least); `directory` the checkpoint directory, needed where the checkpoint is sharded: on every rank of a
    sharded model, on each process of a plain one. Every rank of a sharded model calls this (a collective).

    sharded model, sharded checkpoint   dcp.load, resharded to this world size
    sharded model, plain checkpoint     rank 0's position-keyed state -> name-keyed -> broadcast into the shards
    plain model, plain checkpoint       optimizer.load_state_dict, as before
    plain model, sharded checkpoint     this process reads the whole name-keyed state from the shards
    """
    sharded_model, sharded_ckpt = is_sharded(model), is_sharded_checkpoint(trainer_state)
    folder = Path(directory) / SHARDED if directory is not None else None
    if sharded_ckpt and folder is None:
        raise ValueError("restoring from a sharded checkpoint needs its directory")
    if sharded_model and sharded_ckpt:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    elif sharded_model:
        named = by_name(model, optimizer, trainer_state["optimizer"]) if rt.is_main else {}
        set_optimizer_state_dict(model, optimizer, named,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    elif sharded_ckpt:
        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
            dcp.load(state, checkpoint_id=folder, no_dist=True)
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    else:
        optimizer.load_state_dict(trainer_state["optimizer"])


def by_name(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """A position-keyed `optimizer.state_dict()` (today's trainer_state.pt) keyed by parameter name instead.
    Position i is the i-th parameter of `optimizer`'s groups in order, which names it; `optimizer` must be built
    as the saved one was (train/optim.py's build_optimizer on the same model: the resume rules freeze both)."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for p in chain.from_iterable(g["params"] for g in optimizer.param_groups)]
    saved_count = sum(len(g["params"]) for g in saved["param_groups"])
    if saved_count != len(order):
        raise ValueError(f"checkpoint optimizer state holds {saved_count} parameters, this optimizer "
                         f"{len(order)}: not the same run")
    return {"state": {order[i]: s for i, s in saved["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in saved["param_groups"]]}

