"""Everything a run needs besides its weights to continue exactly where it stopped.

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
from train.rng import rng_state, set_rng_state
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
        every rank. `model` is the bare (or sharded in place) GPT: the optimizer state moves between whole and
        sharded layouts and world sizes (train/sharded_checkpoint.py); `directory` is the checkpoint's folder."""
        restore_optimizer(model, optimizer, self.to_dict(), directory, rt)
        if self.scaler:
            scaler.load_state_dict(self.scaler)
        if self.rng is not None:
            set_rng_state(self.rng, rt.device)
