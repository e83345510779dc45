"""Per-head statistics of causal attention patterns, and a heuristic head-type label.

All functions take plain numpy arrays so they work on weights captured from the model, loaded from
`attention.npz`, or built by hand in tests. A pattern is `[..., T, T]`: row i (the query) is a probability
distribution over keys 0..i, and exactly 0 above the diagonal.

Scores are averaged over queries 1..T-1: query 0 can only attend to itself, so it would count as
"previous-token-free", "first-token" and "self" all at once and tell us nothing.

The induction score needs its own input: the pattern of the same head on a random block of tokens repeated
twice, [r_0 .. r_{n-1}, r_0 .. r_{n-1}]. An induction head at query n + k (the second copy of r_k) attends to key
k + 1, the token that followed r_k last time, i.e. the diagonal at offset n - 1 below the main one. Random tokens
make sure nothing but the repetition can predict what comes next (the TransformerLens / Olsson et al. recipe).
"""
from __future__ import annotations

import math

import numpy as np

from data.json_safe import json_safe

# Heuristic labels. A head gets the first label in this order whose score reaches its threshold:
#   induction       induction score   >= 0.40  (mean weight on the "token after my last occurrence")
#   previous-token  previous score    >= 0.50  (mean weight on key i-1)
#   first-token     first-token score >= 0.50  (mean weight on key 0: an attention sink)
#   self            self score        >= 0.50  (mean weight on key i, the diagonal)
#   uniform         entropy_norm      >= 0.90  (spreads almost evenly over all visible keys)
#   mixed           none of the above
# Induction comes first because an induction head also looks back by a fixed offset; the 0.5 thresholds mean
# "more than half of the head's attention goes to one place"; 0.4 for induction because young induction heads
# share their weight with a sink. Thresholds are heuristics for reading a model, not a classification theory.
THRESHOLDS: dict[str, tuple[str, float]] = {
    "induction": ("induction", 0.40),
    "previous-token": ("prev_token", 0.50),
    "first-token": ("first_token", 0.50),
    "self": ("self", 0.50),
    "uniform": ("entropy_norm", 0.90),
}
STAT_KEYS = ("entropy", "entropy_norm", "mean_distance", "prev_token", "first_token", "self", "induction")


def _check(pattern: np.ndarray) -> np.ndarray:
    p = np.asarray(pattern, dtype=np.float64)
    if p.ndim < 2 or p.shape[-1] != p.shape[-2]:
        raise ValueError(f"attention pattern must be [..., T, T], got shape {p.shape}")
    return p


def entropy(pattern: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean entropy (nats) of each query's distribution, raw and divided by log(number of visible keys).

    The normalised value is 1 for a head that spreads evenly over every key it can see and 0 for a one-hot head,
    whatever the position; raw entropy grows with position and so cannot be compared across prompts.
    """
    p = _check(pattern)
    T = p.shape[-1]
    if T < 2:
        nan = np.full(p.shape[:-2], np.nan)
        return nan, nan
    h = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)[..., 1:]
    keys = np.log(np.arange(2, T + 1, dtype=np.float64))
    return h.mean(-1), (h / keys).mean(-1)


def mean_distance(pattern: np.ndarray) -> np.ndarray:
    """Mean over queries of the expected look-back distance sum_j p_ij (i - j), in tokens."""
    p = _check(pattern)
    T = p.shape[-1]
    if T < 2:
        return np.full(p.shape[:-2], np.nan)
    dist = np.arange(T)[:, None] - np.arange(T)[None, :]
    return (p * np.clip(dist, 0, None)).sum(-1)[..., 1:].mean(-1)


def diagonal_score(pattern: np.ndarray, offset: int, start: int = 1) -> np.ndarray:
    """Mean weight on key i - offset over queries i >= max(start, offset)."""
    p = _check(pattern)
    T = p.shape[-1]
    first = max(start, offset)
    if first >= T:
        return np.full(p.shape[:-2], np.nan)
    rows = np.arange(first, T)
    return p[..., rows, rows - offset].mean(-1)


def first_token_score(pattern: np.ndarray) -> np.ndarray:
    """Mean weight on key 0 over queries 1..T-1 (attention-sink heads)."""
    p = _check(pattern)
    if p.shape[-1] < 2:
        return np.full(p.shape[:-2], np.nan)
    return p[..., 1:, 0].mean(-1)


def induction_score(repeat_pattern: np.ndarray, block: int) -> np.ndarray:
    """Mean weight on key i - block + 1 over the second copy's queries i = block .. 2*block-1.

    `repeat_pattern` is the head's pattern on a block of `block` random tokens repeated twice (2*block tokens).
    """
    p = _check(repeat_pattern)
    if block < 2 or p.shape[-1] < 2 * block:
        raise ValueError(f"induction needs a pattern over 2*block = {2 * block} tokens (block >= 2), "
                         f"got {p.shape[-1]}")
    rows = np.arange(block, 2 * block)
    return p[..., rows, rows - block + 1].mean(-1)


def label_head(scores: dict[str, float]) -> str:
    """The heuristic head type (see THRESHOLDS for the order and the values)."""
    for name, (key, threshold) in THRESHOLDS.items():
        value = scores.get(key)
        if value is not None and not math.isnan(value) and value >= threshold:
            return name
    return "mixed"


def head_stats(weights: np.ndarray, layers: list[int] | None = None, heads: list[int] | None = None,
               repeat_weights: np.ndarray | None = None, block: int = 0) -> list[dict]:
    """One dict per (layer, head) of `weights` [L, H, T, T] with every score of STAT_KEYS and a `label`.

    `layers` and `heads` name the model indices of the rows and columns (default 0..L-1, 0..H-1).
    `repeat_weights` [L, H, 2*block, 2*block] are the same heads on a repeated random block; without them the
    induction score is None. NaN (too short a sequence) becomes None so the result is valid JSON.
    """
    w = _check(weights)
    if w.ndim != 4:
        raise ValueError(f"weights must be [layers, heads, T, T], got shape {w.shape}")
    L, H = w.shape[:2]
    layers = list(range(L)) if layers is None else list(layers)
    heads = list(range(H)) if heads is None else list(heads)
    ent, ent_norm = entropy(w)
    table = {"entropy": ent, "entropy_norm": ent_norm, "mean_distance": mean_distance(w),
             "prev_token": diagonal_score(w, 1), "first_token": first_token_score(w), "self": diagonal_score(w, 0)}
    if repeat_weights is not None:
        table["induction"] = induction_score(repeat_weights, block)
    out = []
    for li, layer in enumerate(layers):
        for hi, head in enumerate(heads):
            row: dict = {"layer": layer, "head": head}
            for key in STAT_KEYS:
                row[key] = json_safe(round(float(table[key][li, hi]), 6)) if key in table else None
            row["label"] = label_head({k: v for k, v in row.items() if isinstance(v, float)})
            out.append(row)
    return out


def summary_scalars(stats: list[dict]) -> dict[str, float]:
    """The few numbers worth a line chart during training: the strongest induction and previous-token heads."""
    def best(key: str) -> float:
        values = [s[key] for s in stats if s.get(key) is not None]
        return max(values) if values else float("nan")

    def mean(key: str) -> float:
        values = [s[key] for s in stats if s.get(key) is not None]
        return float(np.mean(values)) if values else float("nan")

    return {"attn/max_induction": best("induction"), "attn/max_prev_token": best("prev_token"),
            "attn/mean_entropy_norm": mean("entropy_norm")}
