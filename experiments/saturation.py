"""Softmax saturation: random unit-variance q and k, so q.k has variance d_k; softmax with and without the
1/sqrt(d_k) factor. Without it the weights go one-hot as d_k grows and the softmax gradient vanishes."""
from __future__ import annotations

import math

import torch


def softmax_saturation(dims: tuple[int, ...] = (16, 64, 256, 1024), n_keys: int = 64, n_queries: int = 2000,
                       seed: int = 0) -> list[dict]:
    """Per d_k: mean max softmax weight, mean entropy (nats; uniform = ln n_keys) and mean Frobenius norm of the
    softmax Jacobian diag(p) - p p^T, for q.k scores (variance d_k) unscaled and divided by sqrt(d_k).

    The Jacobian norm is the point: a saturated softmax passes almost no gradient back to the scores.
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for d in dims:
        q = torch.randn(n_queries, d, generator=g, dtype=torch.float64)
        k = torch.randn(n_keys, d, generator=g, dtype=torch.float64)
        scores = q @ k.T
        row = {"d_k": d, "n_keys": n_keys, "score_std": scores.std().item()}
        for tag, s in (("unscaled", scores), ("scaled", scores / math.sqrt(d))):
            p = torch.softmax(s, dim=-1)
            p2 = (p * p).sum(-1)
            jac = (p2 - 2 * (p ** 3).sum(-1) + p2 * p2).clamp_min(0).sqrt()
            row[f"max_weight_{tag}"] = p.max(-1).values.mean().item()
            row[f"entropy_{tag}"] = torch.special.entr(p).sum(-1).mean().item()
            row[f"jacobian_{tag}"] = jac.mean().item()
        rows.append(row)
    return rows
