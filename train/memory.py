"""Peak tensor memory of a piece of work, on CUDA and on CPU, for the figures the README prints.

CUDA keeps allocator statistics (`torch.cuda.max_memory_allocated`). The CPU allocator keeps none, so on CPU the
work runs under `torch.profiler` with `profile_memory=True`, which records every allocation and free with its size;
the peak of their running sum is the most memory the work's tensors held at once, above what was live when it began.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass
class Peak:
    bytes: int = 0  # filled in when the `with` block ends

    @property
    def mib(self) -> float:
        return self.bytes / 2 ** 20


@contextlib.contextmanager
def peak_memory(device: torch.device | str = "cpu") -> Iterator[Peak]:
    """`with peak_memory(device) as peak: ...`, then `peak.bytes`: the most tensor memory allocated inside the block
    at once, above what was live at its start. On CPU the profiler slows the block: measure with it, don't time."""
    device, peak = torch.device(device), Peak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        yield peak
        torch.cuda.synchronize(device)
        peak.bytes = torch.cuda.max_memory_allocated(device) - base
        return
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield peak
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = 0
    for e in events:  # frees carry negative sizes
        live += e.nbytes()
        peak.bytes = max(peak.bytes, live)
