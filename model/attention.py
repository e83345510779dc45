"""Attention from the textbook formula, its fused twin, the additive (Bahdanau) scorer, and multi-head attention.

The explicit functions are the reference; `CausalSelfAttention` uses torch's fused kernel unless the weights are
asked for (a hook on `hook_pattern`), the config says `manual`, or the scorer is additive.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.hooks import HookPoint
from model.linear import Linear


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean [t_q, t_k] mask, True where a query may look: key position <= query position.

    With t_k > t_q the queries are the last t_q positions (decoding with a cache).
    """
    t_k = t_q if t_k is None else t_k
    q_pos = torch.arange(t_k - t_q, t_k, device=device).unsqueeze(1)
    return torch.arange(t_k, device=device).unsqueeze(0) <= q_pos


def scaled_dot_product_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None,
                                 scaled: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d_k) + M) V for any leading dims. Returns (output, weights).

    `mask` broadcasts against the scores; positions where it is 0/False get -inf, so their weight is exactly 0.
    `scaled=False` drops the 1/sqrt(d_k) factor (to study softmax saturation).
    """
    scores = Q @ K.transpose(-2, -1)
    if scaled:
        scores = scores / math.sqrt(Q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    attn = torch.softmax(scores, dim=-1)
    return attn @ V, attn


def additive_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor,
                       v: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bahdanau scoring: score(q, k) = v^T tanh(W_q q + W_k k); then masked softmax and weighted sum of V.

    W_q, W_k: [d_k, d_a]; v: [d_a]. Memory is O(T^2 d_a): meant for small models and comparison, not scale.
    """
    hq = (Q @ W_q).unsqueeze(-2)  # [..., Tq, 1, d_a]
    hk = (K @ W_k).unsqueeze(-3)  # [..., 1, Tk, d_a]
    scores = torch.tanh(hq + hk) @ v  # [..., Tq, Tk]
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    attn = torch.softmax(scores, dim=-1)
    return attn @ V, attn


def fused_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, causal: bool, mask: torch.Tensor | None = None,
                    scaled: bool = True, dropout_p: float = 0.0) -> torch.Tensor:
    """The same formula through torch's fused kernel (flash / memory-efficient where available).

    K and V may have fewer heads than Q (grouped-query attention): the kernel shares them without copying, where
    repeat_interleave would copy the whole KV cache at every decode step (measured 15x slower at 1000 cached tokens).
    """
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=causal and mask is None, scale=None if scaled else 1.0,
                                          enable_gqa=K.size(-3) != Q.size(-3))


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """Parameter-free RMS normalisation over the last dimension (used for QK-norm)."""
    return F.rms_norm(x, (x.size(-1),))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one fused QKV projection, heads [B, H, T, d_h], merge, W_O.

    Grouped-query attention: n_kv_head key/value heads, each shared by n_head / n_kv_head query heads.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.kv_heads, config.head_dim
        qkv_out = (self.n_head + 2 * self.n_kv_head) * self.head_dim
        self.c_attn = Linear(config.n_embd, qkv_out, bias=config.bias)
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)  # W_O
        if config.attention == "additive":
            d = self.head_dim
            self.add_wq = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
            self.add_wk = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
            self.add_v = nn.Parameter(torch.randn(d) / math.sqrt(d))
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.hook_pattern = HookPoint()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache=None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(
            [self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.n_kv_head * self.head_dim], dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.config.qk_norm:
            q, k = rms_norm(q), rms_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        row_mask = None
        if cache is not None:
            k, v = cache.update(layer, k, v)
            row_mask = getattr(cache, "attn_mask", None)  # rows of different lengths: [B, 1, T, t_k]
        t_k = k.size(2)
        explicit = self.config.attention != "sdpa" or self.hook_pattern.active
        if explicit and self.n_kv_head != self.n_head:  # the fused kernel shares K/V heads itself
            rep = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if explicit:
            mask = causal_mask(T, t_k, x.device) if row_mask is None else row_mask
            if self.config.attention == "additive":
                y, attn = additive_attention(q, k, v, self.add_wq, self.add_wk, self.add_v, mask)
            else:
                y, attn = scaled_dot_product_attention(q, k, v, mask, scaled=self.config.scaled)
            hooked = self.hook_pattern(attn)  # a hook may return an edited pattern (activation patching)
            if hooked is not attn or (self.training and self.config.dropout > 0):
                y = self.attn_dropout(hooked) @ v
        else:
            mask = row_mask if row_mask is not None else None if t_k == T or T == 1 else causal_mask(T, t_k, x.device)
            y = fused_attention(q, k, v, causal=T > 1, mask=mask, scaled=self.config.scaled,
                                dropout_p=self.config.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def rope_tables(head_dim: int, length: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [length, head_dim / 2] for rotary position embedding."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of each head vector by position-dependent angles. x: [B, H, T, d]."""
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
