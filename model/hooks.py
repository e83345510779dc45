"""Named hook points, in the spirit of TransformerLens's `hook_pattern`: an identity module that callers can hook.

The attention module checks `active` to decide whether the (slower) explicit path is needed: weights are only
materialised when someone registered a forward hook to receive them.
"""
from __future__ import annotations

import torch
from torch import nn


class HookPoint(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        return bool(self._forward_hooks) or bool(self._forward_pre_hooks)
