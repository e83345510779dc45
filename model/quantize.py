"""`--quantize int8`: int8 weights with one scale per output channel for every Linear, the LM head included.

torchao (`quantize_` with `Int8WeightOnlyConfig`) rounds the weights: symmetric int8, one fp32 scale per output
row. What then runs the products depends on the device, because torchao's own weight-only kernel converts the whole
int8 matrix back to the activation dtype on every call on CPU, which reads more bytes than the fp32 weights did
(README, "Decoding"):
- CPU: fbgemm's int8 GEMM (`torch.ops.quantized.linear_dynamic`, the kernel behind the deprecated
  `torch.ao.quantization.quantize_dynamic`), fed torchao's int8 weights and scales unchanged. It multiplies in int8,
  so it also rounds each input to 8 bits on the fly (one scale per call; 7-bit range on x86, where fbgemm's AVX2
  kernel would otherwise saturate). At batch 1 that is one scale per token.
- CUDA: torchao's weight-only kernel, activations untouched.
The model is changed in place at load; the checkpoint on disk stays fp32. The token embedding stays in its dtype
(a lookup reads one row per token); a tied head gets its own int8 copy.
"""
from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from model.param_error import ParamError

QUANTIZE_CHOICES = ("none", "int8")


def check_quantize(mode: str, device: torch.device, dtype: torch.dtype) -> None:
    """Raise a ParamError naming `quantize` (and `dtype`) when `mode` cannot run on this device and dtype."""
    if mode not in QUANTIZE_CHOICES:
        raise ParamError("quantize", f"unknown value {mode!r} (choose from {', '.join(QUANTIZE_CHOICES)})")
    if mode == "none":
        return
    if device.type == "cpu":
        if dtype != torch.float32:
            raise ParamError("quantize", f"int8 on cpu needs {{dtype}} float32 (fbgemm's int8 kernel takes fp32 "
                             f"activations), not {str(dtype).removeprefix('torch.')}", mentions=("dtype",))
        if not _cpu_engine():
            raise ParamError("quantize", "int8 on cpu needs torch's fbgemm/x86 quantized engine, which this "
                             "build of torch lacks")
    elif device.type != "cuda":
        raise ParamError("quantize", f"int8 runs on cpu or cuda, not {device.type}")


def _cpu_engine() -> str | None:
    engines = torch.backends.quantized.supported_engines
    return next((e for e in ("x86", "fbgemm") if e in engines), None)


def import_torchao():
    """torchao logs a warning for each of its CUDA-only libraries it cannot load on a CPU build, and torch one about
    how torchao registers an enum: neither is the user's news."""
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.ERROR)
    try:
        import torchao.quantization as tq
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)
    return tq


class Int8Linear(nn.Module):
    """A Linear whose weight is int8 with per-output-channel scales, run by fbgemm on CPU (see the module doc)."""

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qdata.shape
        engine = _cpu_engine()
        if engine and torch.backends.quantized.engine != engine:
            torch.backends.quantized.engine = engine
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated in torch, the fbgemm ops are not
            warnings.simplefilter("ignore")
            weight = torch._make_per_channel_quantized_tensor(qdata.contiguous(), scale.flatten().double(), zero, 0)
            self._packed = torch.ops.quantized.linear_prepack(weight, None if bias is None else bias.float())
        self.weight_bytes = qdata.numel() + scale.numel() * 4 + (0 if bias is None else bias.numel() * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed, True)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel (fbgemm)"


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, nn.Linear)]


@torch.no_grad()
def quantize_model(model: nn.Module, mode: str) -> nn.Module:
    """Apply `mode` ("none" or "int8") to a loaded model in place and return it; check_quantize first."""
    if mode == "none":
        return model
    device = next(model.parameters()).device
    check_quantize(mode, device, next(model.parameters()).dtype)
    tq = import_torchao()
    config = tq.Int8WeightOnlyConfig(set_inductor_config=False, version=2)  # version 2: qdata + scale per row
    for parent, name, linear in _linears(model):
        # a tied head gets a new int8 parameter of its own; the embedding keeps the original
        tq.quantize_(linear, config, filter_fn=lambda m, fqn: True)
        if device.type == "cpu":
            w = linear.weight
            setattr(parent, name, Int8Linear(w.qdata, w.scale, linear.bias))
    return model
