"""The RNG streams a run draws from (dropout masks), saved in every checkpoint and restored on resume."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from train.state import TrainerState


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


def seed_rank(state: "TrainerState | None", seed: int, rank: int, world_size: int, device: torch.device) -> None:
    """Under DDP every rank draws its own dropout masks (the same masks on different data would correlate the
    noise). A resumed run restores each rank's saved stream when the world size is unchanged; otherwise (or on a
    new run) it starts a fresh one per (seed, rank, step). Runs after the model is built, so weights match anyway."""
    saved = state.rng_ranks if state is not None else None
    if saved and len(saved) == world_size:
        set_rng_state(saved[rank], device)
    else:
        torch.manual_seed(seed + 1_000_003 * (rank + 1) + (state.step if state is not None else 0))
