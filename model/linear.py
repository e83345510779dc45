"""The model's Linear layer: nn.Linear, whose inference products on CPU run through oneDNN instead of MKL.

Why: torch's CPU wheel sends an fp32 F.linear to MKL, which on the AMD EPYC (AVX2, 2 cores) this project is
measured on reads the weights slowly at the row counts decoding feeds. One pass over GPT-2 124M's Linear layers
(0.50 GB of fp32 weights), idle machine, means of 12 passes, same run (README, "Decoding"):

  rows  MKL F.linear  oneDNN  oneDNN, weights packed for 8 rows
  1          49 ms     35 ms     40 ms
  8         117 ms     62 ms     54 ms

oneDNN's matmul ships in the same wheel (torch.compile's CPU backend calls it). The result is the same product up
to float rounding (~1e-6 relative). Batched decoding, [B, 1, C] with B >= 2 (the server, several samples), reads
a copy of the weights that oneDNN has reordered for 8 rows (`torch.ops.mkldnn._reorder_linear_weight`, what
inductor's freezing pass does). It is made on first use, kept while the weight is unchanged (same storage, same
version counter) and dropped with it: one more copy of the weights in memory, paid only by batched decoding, which
repeats every step. Prefills and batch-1 decoding take the plain weights. The copies together stay within half the
memory that was available when the first was made (`pack_budget`): past it a weight is left unpacked (one warning),
so a model too big to hold twice still decodes in batches, on the plain weights (62 instead of 54 ms above).

Only inference takes this path: autograd off (torch.no_grad / inference_mode), CPU, fp32 activations and plain
fp32 weights, no autocast, not under torch.compile (which chooses its own kernels). Training keeps F.linear.

The cost: oneDNN splits a product evenly over torch's threads, so when another process holds one of the cores
the whole product waits for the slow thread. With one busy process beside it, the 1-row pass above took 153 ms on
oneDNN and 68 ms on MKL; `torch.set_num_threads(1)` holds 58-61 ms on either. The scripts' default `--threads
auto` (scripts/inference_args.py) leaves out the cores other processes keep busy. `use_onednn(False)` switches
the path off for the whole process (the benchmarks compare both).
"""
from __future__ import annotations

import os
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

_PLAIN = (torch.Tensor, nn.Parameter)
PACK_ROWS = 8  # the row count the batched-decoding copy is laid out for (the server's default --max-batch)


def _available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_enabled = _available()
# id(weight) -> (its storage pointer, version counter, packed copy); a finalizer drops the copy with the weight
_packed: dict[int, tuple[int, int, torch.Tensor]] = {}
# id(weight) -> (storage pointer, version counter) of a weight the budget refused, not weighed again until it changes
_refused: dict[int, tuple[int, int]] = {}
_budget: int | None = None  # bytes the packed copies may hold together; fixed at the first packing
_warned = False  # the budget's one warning has been given


def available_memory() -> int:
    """Bytes the OS says new allocations can take without swapping (MemAvailable); the free pages where
    /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def pack_budget() -> int:
    """Half the memory available at the first packing: what all packed copies together may take."""
    global _budget
    if _budget is None:
        _budget = available_memory() // 2
    return _budget


def use_onednn(enabled: bool) -> bool:
    """Switch the oneDNN inference path on or off; returns the previous setting. It stays off where the build of
    torch has no oneDNN."""
    global _enabled
    previous = _enabled
    _enabled = bool(enabled) and _available()
    return previous


def onednn_applies_to_weight(weight: torch.Tensor) -> bool:
    """The weight's half of `onednn_applies`: oneDNN on, a plain contiguous fp32 CPU tensor (not a quantized or
    sharded one)."""
    return (_enabled and weight.device.type == "cpu" and weight.dtype == torch.float32 and type(weight) in _PLAIN
            and weight.is_contiguous())


def onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` would run this product through oneDNN (the conditions in the module docstring)."""
    return (onednn_applies_to_weight(weight) and x.device.type == "cpu" and x.dtype == torch.float32
            and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())


def _forget(key: int) -> None:
    _packed.pop(key, None)
    _refused.pop(key, None)


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's copy of `weight` laid out for PACK_ROWS rows, made once and reused until the weight changes; the
    plain weight itself when a copy would take the packed copies past `pack_budget`."""
    global _warned
    wid = id(weight)
    entry = _packed.get(wid)
    # a weight made under inference_mode has no version counter: only its storage can tell a change then
    key = (weight.data_ptr(), -1 if weight.is_inference() else weight._version)
    if entry is not None and entry[:2] == key:
        return entry[2]
    if _refused.get(wid) == key:
        return weight
    if entry is None and wid not in _refused:  # first sight: whatever is kept for it goes with the weight
        weakref.finalize(weight, _forget, wid)
    _forget(wid)  # a stale copy would only hold memory
    held = sum(e[2].numel() * e[2].element_size() for e in _packed.values())
    if held + weight.numel() * weight.element_size() > pack_budget():
        _refused[wid] = key
        if not _warned:
            _warned = True
            warnings.warn(f"model.linear: not packing more weights for batched decoding: the copies would pass "
                          f"{pack_budget() / 2**30:.1f} GiB, half the memory available; the rest reads the "
                          f"plain weights", stacklevel=2)
        return weight
    _packed[wid] = (*key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS))
    return _packed[wid][2]


def prepack(model: nn.Module) -> int:
    """Make the batched-decoding copies of every Linear of `model` that would take them, now rather than at the
    first batched step (the server calls this at start: 0.4 s for GPT-2 124M). Returns how many weights have a
    copy (a tied weight counts once per Linear), fewer than the Linears when `pack_budget` ran out."""
    made = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if isinstance(module, Linear) and w is not None and onednn_applies_to_weight(w):
            with torch.inference_mode():
                made += packed_weight(w) is not w
    return made


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through oneDNN when `onednn_applies`; batched decoding reads the packed copy."""
    if onednn_applies(x, weight) and (bias is None or type(bias) in _PLAIN):
        if x.dim() == 3 and x.size(1) == 1 and x.size(0) > 1:
            weight = packed_weight(weight)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters, state dict and init) whose forward is `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
