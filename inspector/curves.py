"""Loss curves from runs' metrics.jsonl, for users without a dashboard.

A run folder holds `metrics.jsonl`: one JSON object per line with `step`, and among others `train/loss` (every
log interval), `val/loss` (every eval), `tokens` (tokens seen so far). Each run gets one colour; train is a thin
line, val a thick one with markers; the left panel is against step, the right against tokens (which compares
runs of different batch sizes fairly).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

SERIES = (("train/loss", "train", {"linewidth": 1.0, "alpha": 0.55}),
          ("val/loss", "val", {"linewidth": 2.0, "marker": "o", "markersize": 3}))


def metrics_path(run: str | Path) -> Path:
    """A run folder's metrics.jsonl, or the file itself."""
    p = Path(run)
    path = p / "metrics.jsonl" if p.is_dir() else p
    if not path.is_file():
        raise ValueError(f"{run}: no metrics.jsonl there (give a run folder, e.g. checkpoints/shakespeare_char)")
    return path


def read_metrics(run: str | Path) -> list[dict]:
    """The records of a run, in file order; a torn last line (a run killed mid-write) is skipped."""
    path = metrics_path(run)
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                continue
            raise ValueError(f"{path}:{n}: not a JSON line") from None
        if isinstance(rec, dict) and "step" in rec:
            records.append(rec)
    return records


def series(records: list[dict], key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the records holding a finite `key` and `x`; a resumed run's repeated steps keep the last value."""
    points: dict[float, float] = {}
    for rec in records:
        y, xv = rec.get(key), rec.get(x)
        if isinstance(y, (int, float)) and isinstance(xv, (int, float)) and np.isfinite(y):
            points[float(xv)] = float(y)
    xs = np.array(sorted(points))
    return xs, np.array([points[k] for k in xs])


def plot_loss_curves(runs: list[str | Path], labels: list[str] | None = None, logy: bool = False) -> Figure:
    """Train and val loss of each run against step (left) and tokens (right)."""
    if not runs:
        raise ValueError("give at least one run folder")
    labels = labels or [Path(r).resolve().name if Path(r).is_dir() else Path(r).resolve().parent.name for r in runs]
    data = [read_metrics(r) for r in runs]
    if not any(series(d, key)[0].size for d in data for key, _, _ in SERIES):
        raise ValueError("no train/loss or val/loss values in " + ", ".join(str(r) for r in runs))
    has_tokens = any(series(d, key, "tokens")[0].size for d in data for key, _, _ in SERIES)
    fig = Figure(figsize=(12 if has_tokens else 6.5, 4.5), layout="constrained")
    axes = fig.subplots(1, 2 if has_tokens else 1, squeeze=False)[0]
    for ax, x in zip(axes, ("step", "tokens")):
        for i, (records, label) in enumerate(zip(data, labels)):
            colour = f"C{i % 10}"
            for key, name, style in SERIES:
                xs, ys = series(records, key, x)
                if xs.size:
                    ax.plot(xs, ys, color=colour, label=f"{label} {name}", **style)
        ax.set_xlabel("tokens seen" if x == "tokens" else "step")
        ax.set_ylabel("loss (nats per token)")
        ax.grid(True, alpha=0.3)
        if logy:
            ax.set_yscale("log")
        if x == "tokens":
            ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        ax.set_title(f"loss vs {'tokens' if x == 'tokens' else 'step'}")
    axes[0].legend(fontsize=8)
    return fig
