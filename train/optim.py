"""Optimizers and learning-rate schedules.

AdamW decays only 2-D weights (matrices and embeddings), never biases or norm gains. Muon (torch.optim.Muon)
orthogonalises the updates of 2-D hidden weights; embeddings, the head and 1-D parameters stay on AdamW.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from train.config import TrainConfig


def param_groups(model: nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """Split parameters (each once, even when tied) into hidden matrices, embedding/head tables and 1-D tensors."""
    seen, groups = set(), {"hidden": [], "embed": [], "vector": []}
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.ndim < 2:
            groups["vector"].append(p)
        elif name.startswith(("wte", "wpe", "lm_head")) or ".wte" in name or ".lm_head" in name:
            groups["embed"].append(p)
        else:
            groups["hidden"].append(p)
    return groups


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers stepped together, so the trainer and the scheduler see one object."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        # Optimizer.__init__ sets up the hook registries that step hooks and LR schedulers rely on; it keeps the
        # very group dicts it is given, so a change of lr here is a change in the optimizer that owns the group.
        super().__init__([g for opt in optimizers for g in opt.param_groups], defaults={})

    def step(self, closure=None):  # noqa: D102
        loss = closure() if closure is not None else None
        for opt in self.optimizers:
            opt.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for opt, s in zip(self.optimizers, state["optimizers"]):
            opt.load_state_dict(s)


def build_optimizer(model: nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.Optimizer:
    groups = param_groups(model)
    fused = device_type in ("cuda", "cpu")  # one fused kernel per step; the per-tensor loop costs ms on CPU
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "adamw":
        opt = torch.optim.AdamW([
            {"params": groups["hidden"] + groups["embed"], "weight_decay": cfg.weight_decay, "base_lr": cfg.lr},
            {"params": groups["vector"], "weight_decay": 0.0, "base_lr": cfg.lr},
        ], lr=cfg.lr, betas=betas, fused=fused)
        return opt
    adam = torch.optim.AdamW([
        {"params": groups["embed"], "weight_decay": cfg.weight_decay, "base_lr": cfg.lr},
        {"params": groups["vector"], "weight_decay": 0.0, "base_lr": cfg.lr},
    ], lr=cfg.lr, betas=betas, fused=fused)
    muon = torch.optim.Muon([{"params": groups["hidden"], "base_lr": cfg.muon_lr}], lr=cfg.muon_lr,
                            weight_decay=cfg.weight_decay, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    return CombinedOptimizer([muon, adam])


def lr_factor(step: int, progress: float, cfg: TrainConfig) -> float:
    """Multiplier of the peak LR: a linear warmup over the first warmup_iters steps, times a decay to min_lr / lr.

    `progress` in [0, 1] is step / max_iters, or elapsed / max_seconds when a wall-clock budget is set, so a
    time-budgeted run still ends its schedule at the floor.
    """
    floor = cfg.min_lr / cfg.lr if cfg.lr > 0 else 0.0
    warm = min(1.0, (step + 1) / cfg.warmup_iters) if cfg.warmup_iters > 0 else 1.0
    progress = min(max(progress, 0.0), 1.0)
    if cfg.schedule == "wsd":
        decay_start = 1.0 - cfg.decay_fraction
        t = max(0.0, (progress - decay_start) / cfg.decay_fraction)
        return warm * (1.0 - (1.0 - floor) * t)
    return warm * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def set_lr(optimizer: torch.optim.Optimizer, factor: float) -> float:
    """Scale every group's base LR; returns the main (AdamW) LR for logging."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
    return optimizer.param_groups[-1]["lr"]
