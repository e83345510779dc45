"""The pieces of a block besides attention: norms, position-wise FFN variants, sinusoidal positions, the block."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import CausalSelfAttention
from model.config import ModelConfig
from model.linear import Linear


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd)
    return nn.LayerNorm(config.n_embd, bias=config.bias)


class MLP(nn.Module):
    """Position-wise FFN: gelu (GPT-2, tanh approximation), gelu_exact (erf, as nanoGPT), swiglu (gate and up fused in c_fc), relu^2, or relu."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.kind = config.mlp
        hidden = config.ffn_hidden
        fc_out = 2 * hidden if self.kind == "swiglu" else hidden
        self.c_fc = Linear(config.n_embd, fc_out, bias=config.bias)
        self.c_proj = Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.kind == "relu2":
            h = F.relu(h).square()
        elif self.kind == "relu":
            h = F.relu(h)
        elif self.kind == "gelu_exact":
            h = F.gelu(h)
        else:
            h = F.gelu(h, approximate="tanh")
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope=None, cache=None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope=rope, cache=cache, layer=layer)
        return x + self.mlp(self.ln_2(x))


def sinusoidal_table(length: int, dim: int) -> torch.Tensor:
    """The fixed positions of "Attention Is All You Need": sin on even, cos on odd dims, wavelengths up to 10000*2pi."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div)[:, : dim // 2]
    return table
