"""Static pictures of attention: a layers x heads grid, one figure per layer, and a head-score overview.

Figures are built with `matplotlib.figure.Figure` (the Agg canvas), never pyplot: no global state, no display
needed, safe inside a training loop. Colours use a square-root scale from 0 to 1 so weak-but-real attention is
visible and every panel shares one scale; the causal upper triangle is drawn grey, not as "zero attention".
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import PowerNorm
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

CMAP = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
NORM = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
MIN_LABEL_PT = 5.0  # token labels are drawn only when they can be at least this size (points)


def display_token(text: str) -> str:
    """A readable axis label: whitespace made visible, long tokens shortened."""
    shown = text.replace("\n", "\u21b5").replace("\t", "\u21e5").replace(" ", "\u2423")
    return shown if len(shown) <= 12 else shown[:11] + "\u2026"


def _masked(pattern: np.ndarray) -> np.ma.MaskedArray:
    T = pattern.shape[-1]
    return np.ma.masked_array(pattern, mask=np.triu(np.ones((T, T), dtype=bool), k=1))


def _draw(ax, pattern: np.ndarray, labels: list[str] | None, show_x: bool, show_y: bool, fontsize: float,
          positions: bool = False):
    """One head; token labels when given, else position numbers (if `positions`) or nothing."""
    image = ax.imshow(_masked(pattern), cmap=CMAP, norm=NORM, interpolation="nearest")
    T = pattern.shape[-1]
    if labels is not None:
        ticks = np.arange(T)
        ax.set_xticks(ticks, labels if show_x else [], rotation=90, fontsize=fontsize)
        ax.set_yticks(ticks, labels if show_y else [], fontsize=fontsize)
        ax.tick_params(length=0, pad=1)
    elif positions:
        ax.tick_params(labelsize=fontsize + 1, length=2)
        if show_x:
            ax.set_xlabel("key position", fontsize=fontsize + 1)
        if show_y:
            ax.set_ylabel("query position", fontsize=fontsize + 1)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    return image


def _label_size(cell_inches: float, T: int) -> float:
    """Font size (points) that fits one token label per row of a `cell_inches` panel; capped at 9."""
    return min(9.0, 0.7 * cell_inches * 72 / max(T, 1))


def _labels(tokens: list[str], cell_inches: float) -> list[str] | None:
    readable = _label_size(cell_inches, len(tokens)) >= MIN_LABEL_PT
    return [display_token(t) for t in tokens] if readable else None


def _head_title(layer: int, head: int, stats: dict | None) -> str:
    label = stats.get("label") if stats else None
    return f"L{layer} H{head}" + (f" \u00b7 {label}" if label and label != "mixed" else "")


def plot_grid(weights: np.ndarray, tokens: list[str], layers: list[int], heads: list[int],
              stats: list[dict] | None = None, title: str = "") -> Figure:
    """Every captured head, layers down and heads across (weights [L, H, T, T])."""
    L, H, T = weights.shape[0], weights.shape[1], weights.shape[-1]
    cell = 2.6 if max(L, H) <= 6 else 1.8  # a 12 x 12 grid stays near 3000 px wide
    labels = _labels(tokens, cell)
    if labels is None:
        return _mosaic(weights, layers, heads, stats, title, cell)
    fig = Figure(figsize=(cell * H + 1.2, cell * L + 0.9), layout="constrained")
    axes = fig.subplots(L, H, squeeze=False)
    by_head = {(s["layer"], s["head"]): s for s in stats or []}
    image = None
    for li, layer in enumerate(layers):
        for hi, head in enumerate(heads):
            ax = axes[li, hi]
            image = _draw(ax, weights[li, hi], labels, li == L - 1, hi == 0, _label_size(cell, T))
            ax.set_title(_head_title(layer, head, by_head.get((layer, head))), fontsize=9)
    fig.colorbar(image, ax=axes, shrink=min(1.0, 0.9 / max(L, 1) + 0.3), label="attention weight")
    fig.suptitle(title or f"attention: {T} tokens (rows = queries, columns = keys)", fontsize=11)
    return fig


def _mosaic(weights: np.ndarray, layers: list[int], heads: list[int], stats: list[dict] | None, title: str,
            cell: float) -> Figure:
    """The grid as one tiled image: far cheaper to draw than L x H axes (the trainer draws it at every eval), and
    each head's name and label sit in its own empty (future) corner."""
    L, H, T = weights.shape[0], weights.shape[1], weights.shape[-1]
    gap = max(1, T // 12)
    rgba = np.ones((L * T + (L - 1) * gap, H * T + (H - 1) * gap, 4))
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    grey = matplotlib.colors.to_rgba("#d9d9d9")
    by_head = {(s["layer"], s["head"]): s for s in stats or []}
    fig = Figure(figsize=(cell * H + 1.2, cell * L + 0.7), layout="constrained")
    ax = fig.subplots()
    for li in range(L):
        for hi in range(H):
            tile = CMAP(NORM(weights[li, hi]))
            tile[future] = grey
            y, x = li * (T + gap), hi * (T + gap)
            rgba[y:y + T, x:x + T] = tile
            label = (by_head.get((layers[li], heads[hi])) or {}).get("label", "mixed")
            ax.text(x + T - 1, y + 1, f"L{layers[li]} H{heads[hi]}" + ("" if label == "mixed" else f"\n{label}"),
                    ha="right", va="top", fontsize=8 if cell > 2 else 6.5, color="#333")
    ax.imshow(rgba, interpolation="nearest")
    ax.set_xticks([hi * (T + gap) + T / 2 for hi in range(H)], [f"head {h}" for h in heads], fontsize=9)
    ax.set_yticks([li * (T + gap) + T / 2 for li in range(L)], [f"layer {layer}" for layer in layers], fontsize=9)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    fig.colorbar(ScalarMappable(norm=NORM, cmap=CMAP), ax=ax, shrink=min(1.0, 0.9 / max(L, 1) + 0.3),
                 label="attention weight")
    fig.suptitle(title or f"attention: {T} tokens (in each head, rows = queries, columns = keys)", fontsize=11)
    return fig


def plot_layer(weights_layer: np.ndarray, tokens: list[str], layer: int, heads: list[int],
               stats: list[dict] | None = None) -> Figure:
    """The heads of one layer (weights [H, T, T]) plus their average, larger and with token labels."""
    panels = [(f"L{layer} H{h}", weights_layer[i], h) for i, h in enumerate(heads)]
    if len(heads) > 1:
        panels.append((f"L{layer} head average", weights_layer.mean(0), None))
    cell = 3.6 if _labels(tokens, 3.6) or not _labels(tokens, 4.8) else 4.8  # larger only if that shows labels
    labels = _labels(tokens, cell)
    nrows = math.ceil(len(panels) / 4)
    ncols = math.ceil(len(panels) / nrows)  # 5 panels: 3 + 2, not 4 + 1
    fig = Figure(figsize=(cell * ncols + 1.0, cell * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    by_head = {s["head"]: s for s in stats or [] if s["layer"] == layer}
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(panels):
            ax.set_visible(False)
            continue
        name, pattern, head = panels[k]
        image = _draw(ax, pattern, labels, k >= len(panels) - ncols, k % ncols == 0,
                      max(6.0, _label_size(cell, len(tokens))), positions=True)
        title = _head_title(layer, head, by_head.get(head)) if head is not None else name
        ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    return fig


SCORE_PANELS = (("prev_token", "previous-token"), ("first_token", "first-token (sink)"), ("self", "self"),
                ("induction", "induction"), ("entropy_norm", "entropy / log(keys)"))


def plot_head_scores(stats: list[dict]) -> Figure:
    """One small layers x heads heatmap per score, values written in: where the induction heads are, at a glance."""
    layers = sorted({s["layer"] for s in stats})
    heads = sorted({s["head"] for s in stats})
    panels = [(k, name) for k, name in SCORE_PANELS if any(s.get(k) is not None for s in stats)]
    fig = Figure(figsize=(max(2.2, 0.55 * len(heads) + 1.0) * len(panels), 0.5 * len(layers) + 1.4),
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, name) in zip(axes, panels):
        grid = np.full((len(layers), len(heads)), np.nan)
        for s in stats:
            if s.get(key) is not None:
                grid[layers.index(s["layer"]), heads.index(s["head"])] = s[key]
        ax.imshow(np.ma.masked_invalid(grid), cmap=CMAP, vmin=0, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(len(heads)), [f"H{h}" for h in heads], fontsize=7)
        ax.set_yticks(range(len(layers)), [f"L{layer}" for layer in layers], fontsize=7)
    return fig


def to_array(fig: Figure, dpi: int = 100) -> np.ndarray:
    """The figure rendered as an RGB uint8 array [H, W, 3] (what trackers such as wandb.Image take)."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write `fig` as PNG and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
