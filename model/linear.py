"""The model's Linear layer: nn.Linear, whose inference products on CPU run through oneDNN instead of MKL.

Why: torch's CPU wheel sends an fp32 F.linear to MKL's sgemm, which on the AMD EPYC (AVX2) this project is measured
on is slow at the few rows that decoding feeds: a batch-8 decode step cost 2.5-3x a batch-1 one, although both read
the same 0.5 GB of weights (README, "Serving"). oneDNN's matmul, which torch ships in the same wheel (it is what
torch.compile's CPU backend calls), reads the weights in their own [out, in] layout with no packing copy; measured
side by side in `python -m scripts.bench_decode --linear-kernels`. The result is the same product up to float
rounding (~1e-6 relative).

Only inference takes that path: autograd off (torch.no_grad / inference_mode), CPU, fp32 activations and plain
fp32 weights, no autocast, not under torch.compile (which chooses its own kernels). Everything else, training
first, keeps F.linear. `use_onednn(False)` turns the path off for the whole process (the benchmarks compare both).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_PLAIN = (torch.Tensor, nn.Parameter)
_enabled = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def use_onednn(enabled: bool) -> bool:
    """Switch the oneDNN inference path on or off; returns the previous setting. It stays off where the build of
    torch has no oneDNN."""
    global _enabled
    previous = _enabled
    _enabled = bool(enabled) and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                                                   "_linear_pointwise")
    return previous


def onednn_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` would run this product through oneDNN (the conditions in the module docstring)."""
    return (_enabled and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and type(weight) in _PLAIN and weight.is_contiguous() and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through oneDNN when `onednn_applies`."""
    if onednn_applies(x, weight) and (bias is None or type(bias) in _PLAIN):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters, state dict and init) whose forward is `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
