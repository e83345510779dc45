"""Random (x, y) windows over memmapped token shards, deterministic from (seed, split, step).

Each step's *global* batch is batch_size * micro_steps * world_size windows, drawn from a generator seeded with
(seed, split, step); micro-step m of rank r takes block m * world_size + r of batch_size windows. So a batch is a
pure function of (seed, split, step, micro_step, rank, world_size, micro_steps), ranks see different windows, and a
step holds the same windows however it is split between processes and micro-steps: 2 ranks x 1 micro-step see
what 1 process x 2 micro-steps sees, which is what lets a run resume on another number of processes.
The split is treated as one token stream; a window may run across a shard boundary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from data.meta import SPLITS, read_meta

_SPLIT_IDS = {name: i for i, name in enumerate(SPLITS)}


class ShardLoader:
    """get_batch(step, micro_step) -> (x, y), int64 tensors [batch_size, block_size] on `device`; y is x shifted by one.

    `micro_steps` is the number of micro-batches per step (train.grad_accum): part of the global batch's size.

    `device` may be a CUDA device: batches are then staged in pinned (page-locked) memory and copied without
    blocking, so the host goes on while the copy waits its turn behind the GPU's queued work. `batches()` fetches
    one batch ahead for the training loop.
    """

    def __init__(self, directory: str | Path, split: str, batch_size: int, block_size: int, seed: int,
                 rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu", micro_steps: int = 1):
        if split not in _SPLIT_IDS:
            raise ValueError(f"split: {split!r} is not one of {', '.join(SPLITS)}")
        if batch_size < 1 or block_size < 1 or micro_steps < 1:
            raise ValueError(f"batch_size, block_size and micro_steps must be >= 1 (got {batch_size}, {block_size}, "
                             f"{micro_steps})")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..world_size-1 (world_size {world_size})")
        if seed < 0:
            raise ValueError(f"seed: {seed} must be >= 0")
        self.directory = Path(directory)
        self.meta = read_meta(directory)
        self.split, self.batch_size, self.block_size, self.seed = split, batch_size, block_size, seed
        self.rank, self.world_size, self.micro_steps = rank, world_size, micro_steps
        self.device = torch.device(device)
        self.shards = [self._open(name) for name in self.meta["shards"][split]]
        sizes = [len(s) for s in self.shards]
        if sum(sizes) != self.meta["tokens"][split]:
            raise ValueError(f"{self.directory}: the {split} shards hold {sum(sizes)} tokens but meta.json says "
                             f"{self.meta['tokens'][split]}; run python -m scripts.prepare again")
        self.starts = np.cumsum([0] + sizes)  # global offset of each shard's first token
        self.n_tokens = int(self.starts[-1])
        if self.n_tokens < block_size + 1:
            raise ValueError(f"the {split} split has {self.n_tokens} tokens, fewer than block_size + 1 = "
                             f"{block_size + 1}; lower block_size or use more text")

    def _open(self, name: str) -> np.memmap:
        path = self.directory / name
        if not path.is_file():
            raise ValueError(f"{self.directory}: shard {name} is missing; run python -m scripts.prepare again")
        return np.memmap(path, dtype=np.dtype(self.meta["dtype"]).newbyteorder("<"), mode="r")

    def offsets(self, step: int, micro_step: int = 0) -> np.ndarray:
        """The first token of each of this rank's windows."""
        if step < 0 or not 0 <= micro_step < self.micro_steps:
            raise ValueError(f"step must be >= 0 and micro_step in 0..{self.micro_steps - 1} (got {step}, {micro_step})")
        entropy = [self.seed, _SPLIT_IDS[self.split], step]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        size = self.batch_size * self.micro_steps * self.world_size
        starts = rng.integers(0, self.n_tokens - self.block_size, size=size)
        block = micro_step * self.world_size + self.rank
        return starts[block * self.batch_size:(block + 1) * self.batch_size]

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the split as int64, across shard boundaries if need be."""
        out = np.empty(length, dtype=np.int64)
        filled = 0
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while filled < length:
            local = start + filled - int(self.starts[shard])
            take = min(length - filled, len(self.shards[shard]) - local)
            out[filled:filled + take] = self.shards[shard][local:local + take]
            filled += take
            shard += 1
        return out

    def get_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        windows = np.stack([self.read(int(s), self.block_size + 1) for s in self.offsets(step, micro_step)])
        x = torch.from_numpy(windows[:, :-1].copy())
        y = torch.from_numpy(windows[:, 1:].copy())
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def batches(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of (step, 0), ..., (step, micro_steps - 1), (step + 1, 0), ... in that order, endlessly.

        Each is read (and on CUDA its copy issued) before the one before it is handed out, so the reading of the next
        batch overlaps the GPU's work on the current one. Batches stay a pure function of their (step, micro_step).
        """
        return self._one_ahead(step, self.micro_steps, self.get_batch(step, 0))  # the first read now, at the call

    def _one_ahead(self, step: int, micro_steps: int, ahead: tuple) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        micro = 0
        while True:
            current = ahead
            micro += 1
            if micro == micro_steps:
                step, micro = step + 1, 0
            ahead = self.get_batch(step, micro)
            yield current
