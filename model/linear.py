"""The model's Linear layer: nn.Linear, whose inference products on CPU run through oneDNN instead of MKL.

Why: torch's CPU wheel sends an fp32 F.linear to MKL's sgemm, which on the AMD EPYC (AVX2) this project is measured
on is slow at the few rows that batched decoding feeds: at 8 rows it ran 3x slower than at 1, although both read
the same weights (README, "Serving"). oneDNN's matmul, which torch ships in the same wheel (it is what
torch.compile's CPU backend calls), does 8 rows in 1.2-2x the time of one. The result is the same product up to
float rounding (~1e-6 relative). `python -m scripts.bench_serve` times the bare model's decode forward at batch 1
and 8 both ways.

Only inference with at least 2 rows takes that path: autograd off (torch.no_grad / inference_mode), CPU, fp32
activations and plain fp32 weights, no autocast, not under torch.compile (which chooses its own kernels). One row
(batch-1 decoding) stays on MKL's matrix-vector kernel: on the idle machine oneDNN's was faster, but with the 2
cores shared with other jobs its threads stall (a pass over GPT-2's layers took 2-3x MKL's), where MKL's holds up.
Everything else, training first, keeps F.linear. `use_onednn(False)` turns the path off for the whole process (the benchmarks compare both).
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
    return (_enabled and x.numel() >= 2 * x.size(-1) and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
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
