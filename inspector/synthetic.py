"""Hand-built attention heads of known type, so detectors, plots and the viewer can be checked without a model.

Each builder returns a causal pattern [T, T] (rows sum to 1, zero above the diagonal). The induction head is
defined for a block of `block` tokens repeated twice (T = 2 * block): in the first copy nothing has repeated yet,
so it spreads evenly; in the second copy query i attends to key i - block + 1.
"""
from __future__ import annotations

import numpy as np

HEAD_TYPES = ("previous-token", "first-token", "self", "induction", "uniform")


def uniform_head(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]


def previous_token_head(T: int) -> np.ndarray:
    p = np.zeros((T, T))
    p[0, 0] = 1.0
    p[np.arange(1, T), np.arange(T - 1)] = 1.0
    return p


def first_token_head(T: int) -> np.ndarray:
    p = np.zeros((T, T))
    p[:, 0] = 1.0
    return p


def self_head(T: int) -> np.ndarray:
    return np.eye(T)


def induction_head(block: int) -> np.ndarray:
    T = 2 * block
    p = uniform_head(T)
    rows = np.arange(block, T)
    p[rows] = 0.0
    p[rows, rows - block + 1] = 1.0
    return p


def synthetic_weights(block: int = 16, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    """Weights [1, 5, 2*block, 2*block], one head per HEAD_TYPES entry, and the repeated random token ids."""
    T = 2 * block
    builders = {"previous-token": previous_token_head, "first-token": first_token_head, "self": self_head,
                "uniform": uniform_head, "induction": lambda _: induction_head(block)}
    w = np.stack([builders[name](T) for name in HEAD_TYPES])[None].astype(np.float32)
    rng = np.random.default_rng(seed)
    ids = rng.choice(1000, size=block, replace=False).tolist()
    return w, ids + ids
