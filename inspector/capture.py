"""Capture attention weights through the model's named hook points, and the token plumbing around it.

Every attention module owns an identity submodule `hook_pattern` (named `blocks.{i}.attn.hook_pattern`, like
TransformerLens). The model sends its weights [B, n_head, T, T] through it only while a forward hook is
registered, and otherwise keeps the fused kernel; so capture registers hooks, runs one forward under no_grad and
removes every hook in `finally`, leaving the model exactly as it found it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

_HOOK_NAME = re.compile(r"(?:^|\.)blocks\.(\d+)\.attn\.hook_pattern$")


def hook_points(model: nn.Module) -> dict[int, nn.Module]:
    """Layer index -> its `hook_pattern` module, in layer order."""
    points = {int(m.group(1)): mod for name, mod in model.named_modules() if (m := _HOOK_NAME.match(name))}
    if not points:
        raise ValueError("this model exposes no blocks.{i}.attn.hook_pattern hook points")
    return dict(sorted(points.items()))


@torch.no_grad()
def capture_attention(model: nn.Module, idx: torch.Tensor,
                      layers: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `model(idx)` once and return (logits, weights [len(layers), B, n_head, T, T] as float32 on the CPU).

    Only the hooks of `layers` (default: all) are registered, so other layers keep the fused path.
    """
    points = hook_points(model)
    layers = list(points) if layers is None else list(layers)
    for layer in layers:
        if layer not in points:
            raise ValueError(f"layer {layer} out of range 0..{len(points) - 1}")
    seen: dict[int, torch.Tensor] = {}
    handles = []

    def make_hook(layer: int):
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            seen[layer] = output.detach().float().cpu()
        return hook

    try:
        for layer in layers:
            handles.append(points[layer].register_forward_hook(make_hook(layer)))
        out = model(idx)
    finally:
        for handle in handles:
            handle.remove()
    logits = out[0] if isinstance(out, tuple) else out
    missing = [layer for layer in layers if layer not in seen]
    if missing:
        raise RuntimeError(f"the forward pass never reached the hook point of layers {missing}")
    return logits, torch.stack([seen[layer] for layer in layers])


def token_strings(tokenizer, ids: list[int]) -> list[str]:
    """Each token decoded on its own: the labels of the axes. (A BPE token that splits a UTF-8 character
    decodes to U+FFFD; that is the honest label of such a token.)"""
    return [tokenizer.decode([i]) for i in ids]


def repeated_random_tokens(vocab_size: int, block: int, seed: int = 0) -> list[int]:
    """A block of distinct random token ids (when the vocabulary allows), repeated twice: the induction probe."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(vocab_size, size=block, replace=vocab_size < block).tolist()
    return ids + ids


@dataclass
class Capture:
    """What one inspection captured: weights [L, H, T, T] of the chosen layers/heads and their tokens."""

    weights: np.ndarray
    token_ids: list[int]
    tokens: list[str]
    layers: list[int]
    heads: list[int]
    repeat_weights: np.ndarray | None = None  # same heads on `repeat_ids` (for the induction score)
    repeat_ids: list[int] = field(default_factory=list)
    n_prompt: int = 0  # how many of the tokens came from the prompt (the rest were generated)
