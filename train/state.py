"""Everything a run needs besides its weights to continue exactly where it stopped, and the RNG streams in it.

`TrainerState` is the one place that knows what goes into `trainer_state.pt` and what comes back out of it;
`model/checkpoint.py` only stores the dict, with `torch.load(weights_only=True)`, so every field is a tensor or
a plain container.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from model.checkpoint import load_trainer_state
from train.runtime import Runtime
from train.sharded_checkpoint import restore as restore_optimizer


@dataclass
class TrainerState:
    step: int = 0
    elapsed: float = 0.0  # training seconds, summed over steps (evaluation and checkpoints excluded)
    tokens: int = 0
    best_val: float = math.inf
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    wandb_id: str | None = None  # so a resumed run continues the same wandb run
    rng: dict | None = None  # rank 0's RNG streams (CPU, and its own GPU)
    rng_ranks: list | None = None  # every rank's, under torchrun: each rank draws its own dropout masks
    optimizer: dict | None = None
    scaler: dict | None = None  # fp16's GradScaler
    dtype: str = ""  # the precision the run computes in, so `auto` keeps it on resume
    device_type: str = ""
    optimizer_dir: str | None = None  # a sharded (fsdp) run: the optimizer state lies in this folder beside

    @classmethod
    def load(cls, directory: str | Path) -> "TrainerState":
        return cls.from_dict(load_trainer_state(directory))

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> "TrainerState":
        """Unknown keys are ignored and missing ones take their defaults, so older checkpoints still resume."""
        missing = [k for k in ("step", "elapsed", "tokens", "best_val", "run_id") if k not in saved]
        if missing:
            raise ValueError(f"trainer state lacks {', '.join(missing)}: not a checkpoint this trainer wrote")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """Shallow (the optimizer's tensors are not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def snapshot(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, device: torch.device,
                 dtype: torch.dtype, rng_ranks: list | None) -> dict[str, Any]:
        """What `trainer_state.pt` holds at this moment: these counters, the optimizer's and the scaler's state and
        the RNG streams. `optimizer=None` leaves the optimizer out (a sharded run saves it beside, sharded)."""
        return replace(self, optimizer=optimizer.state_dict() if optimizer is not None else None,
                       scaler=scaler.state_dict(), rng=rng_state(device), rng_ranks=rng_ranks,
                       dtype=str(dtype).removeprefix("torch."), device_type=device.type).to_dict()

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                rt: Runtime, directory: str | Path | None) -> None:
        """Put the saved optimizer, scaler and RNG state back (the counters are this object's own fields), on
        every rank. `model` is the wrapped one: the optimizer state moves between whole and sharded layouts and
        world sizes (train/sharded_checkpoint.py); `directory` is the checkpoint, where its shards lie."""
        restore_optimizer(model, optimizer, self.to_dict(), directory, rt)
        if self.scaler:
            scaler.load_state_dict(self.scaler)
        if self.rng is not None:
            set_rng_state(self.rng, rt.device)


def rng_state(device: torch.device) -> dict:
    """The CPU generator's state and, on CUDA, that of this process's own GPU only: a resume may see fewer GPUs
    than the save did (another machine, CUDA_VISIBLE_DEVICES), and the run draws from no other."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    saved = state.get("cuda")
    if device.type != "cuda" or saved is None:
        return
    if isinstance(saved, (list, tuple)):  # older checkpoints: every visible GPU's state, by device index
        index = device.index or 0
        if index >= len(saved):
            return
        saved = saved[index]
    torch.cuda.set_rng_state(saved, device)


def seed_rank(state: TrainerState | None, seed: int, rank: int, world_size: int, device: torch.device) -> None:
    """Under DDP every rank draws its own dropout masks (the same masks on different data would correlate the
    noise). A resumed run restores each rank's saved stream when the world size is unchanged; otherwise (or on a
    new run) it starts a fresh one per (seed, rank, step). Runs after the model is built, so weights match anyway."""
    saved = state.rng_ranks if state is not None else None
    if saved and len(saved) == world_size:
        set_rng_state(saved[rank], device)
    else:
        torch.manual_seed(seed + 1_000_003 * (rank + 1) + (state.step if state is not None else 0))
