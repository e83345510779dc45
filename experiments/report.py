"""The ablation's results: markdown tables, the three figures, results.md and results.json."""
from __future__ import annotations

import json
import math
import platform
from pathlib import Path

import torch
from matplotlib.figure import Figure

from data.atomic import write_text_atomic
from data.json_safe import json_safe
from experiments.variants import COLORS
from train.config import RunConfig


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def variants_table(variants: list[dict]) -> str:
    lines = ["| variant | final val loss | best val loss | final mean entropy | train s |", "|---|---|---|---|---|"]
    for v in variants:
        name = v["label"] + (" (diverged)" if v.get("diverged") else "")
        lines.append(f"| {name} | {_fmt(v['final_val'])} | {_fmt(v['best_val'])} | {_fmt(v['final_entropy'], 3)} "
                     f"| {_fmt(v['train_seconds'], 1)} |")
    return "\n".join(lines)


def saturation_table(rows: list[dict]) -> str:
    n = rows[0]["n_keys"] if rows else 0
    lines = ["| d_k | score std | max weight, unscaled / scaled | entropy (nats), unscaled / scaled "
             "| softmax grad norm, unscaled / scaled |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['d_k']} | {r['score_std']:.1f} | {r['max_weight_unscaled']:.3f} / "
                     f"{r['max_weight_scaled']:.3f} | {r['entropy_unscaled']:.2f} / {r['entropy_scaled']:.2f} | "
                     f"{r['jacobian_unscaled']:.3f} / {r['jacobian_scaled']:.3f} |")
    if rows:
        lines.append(f"\n{n} keys per query. Uniform attention: max weight 1/{n} = {1 / n:.3f}, entropy "
                     f"ln {n} = {math.log(n):.2f} nats; one-hot: max weight 1, entropy 0.")
    return "\n".join(lines)


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.3g}"


def cost_table(rows: list[dict]) -> str:
    lines = ["| T | [B,H,T,T] fp32 MB | explicit ms | fused ms | explicit / fused | explicit peak MB | fused peak MB "
             "| max abs diff |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['T']} | {_mb(r['score_bytes'])} | {r['explicit_ms']:.3g} | {r['fused_ms']:.3g} | "
                     f"{r['time_ratio']:.2f} | {_mb(r['explicit_peak_bytes'])} | {_mb(r['fused_peak_bytes'])} | "
                     f"{r['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def plot_variants(variants: list[dict], setup: str = "") -> Figure:
    """Val loss and mean normalised attention entropy against step, one line per variant."""
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    if setup:
        fig.suptitle(setup, fontsize=9)
    ax_loss, ax_ent = fig.subplots(1, 2)
    for v in variants:
        style = {"color": COLORS[v["variant"]], "marker": "o", "markersize": 3, "linewidth": 1.8, "label": v["label"]}
        ax_loss.plot(v["steps"], v["val_loss"], **style)
        ax_ent.plot(v["entropy_steps"], v["entropy"], **style)
    ax_loss.set(xlabel="step", ylabel="val loss (nats/token)", title="validation loss (same eval batches)")
    ax_ent.set(xlabel="step", ylabel="entropy / ln(visible keys)", title="mean attention entropy (probe, all heads)",
               ylim=(0, 1.02))
    for ax in (ax_loss, ax_ent):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def plot_saturation(rows: list[dict]) -> Figure:
    """Max weight, entropy and softmax gradient norm against d_k, with and without the 1/sqrt(d_k) scale."""
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    dims = [r["d_k"] for r in rows]
    n = rows[0]["n_keys"]
    panels = (("max_weight", "mean max softmax weight", (0, 1.05), 1 / n),
              ("entropy", "mean entropy (nats)", (0, math.log(n) * 1.05), math.log(n)),
              ("jacobian", r"gradient through softmax: mean $\|\partial p / \partial s\|_F$", None, None))
    for ax, (key, title, ylim, uniform) in zip(axes, panels):
        ax.plot(dims, [r[f"{key}_scaled"] for r in rows], "o-", color="tab:blue", label="scores / sqrt(d_k)")
        ax.plot(dims, [r[f"{key}_unscaled"] for r in rows], "s--", color="tab:red", label="scores unscaled")
        if uniform is not None:
            ax.axhline(uniform, color="grey", linewidth=0.8, linestyle=":", label="uniform")
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.set(xlabel="d_k", title=title)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"softmax over {n} keys of q.k, q and k with unit-variance entries (score variance d_k)")
    return fig


def plot_cost(rows: list[dict], mode: str, device: str = "cpu") -> Figure:
    """Time and peak memory of the two paths against T (log-log), with the size of one score matrix for scale."""
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    fig.suptitle(f"explicit softmax(QK^T / sqrt(d)) V vs torch's fused kernel: causal, float32, {device}; "
                 "red labels = explicit / fused", fontsize=9)
    ax_t, ax_m = fig.subplots(1, 2)
    T = [r["T"] for r in rows]
    for name, color, marker in (("explicit", "tab:red", "s"), ("fused", "tab:blue", "o")):
        ax_t.plot(T, [r[f"{name}_ms"] for r in rows], marker=marker, color=color, label=name)
        ax_m.plot(T, [r[f"{name}_peak_bytes"] / 2**20 for r in rows], marker=marker, color=color, label=name)
    ax_m.plot(T, [r["score_bytes"] / 2**20 for r in rows], ":", color="grey", label="one [B,H,T,T] fp32 tensor")
    r0 = rows[0]
    shape = f"B={r0['batch']}, H={r0['heads']}, d={r0['head_dim']}"
    ax_t.set(xlabel="sequence length T", ylabel="ms per call (fastest of several)", title=f"time, {mode} ({shape})")
    ax_m.set(xlabel="sequence length T", ylabel="MB above the inputs", title=f"peak memory ({r0['memory_method']})")
    for r in rows:
        ax_t.annotate(f"x{r['time_ratio']:.1f}", (r["T"], r["explicit_ms"]), textcoords="offset points",
                      xytext=(0, 7), ha="center", fontsize=8, color="tab:red")
        ax_m.annotate(f"x{r['explicit_peak_bytes'] / max(r['fused_peak_bytes'], 1):.0f}",
                      (r["T"], r["explicit_peak_bytes"] / 2**20), textcoords="offset points", xytext=(0, 7),
                      ha="center", fontsize=8, color="tab:red")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(T, [str(t) for t in T])
        ax.grid(alpha=0.3, which="both")
        ax.margins(y=0.12)  # room for the ratio labels
        ax.legend(fontsize=8)
    return fig


def write_results(out_dir: str | Path, base: RunConfig, variants: list[dict], saturation: list[dict],
                  cost: list[dict], cost_mode: str, cost_device: str) -> dict[str, Path]:
    """results.md (the three tables), results.json (everything, curves included) and the figures."""
    from inspector.plots import save

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    m, t = base.model, base.train
    extras = "".join(f", {k} {v}" for k, v in _model_extras(base).items())
    setup = (f"{m.n_layer} layers, {m.n_head} heads, d_model {m.n_embd}, block {m.block_size}{extras}; data "
             f"{base.data.source} ({base.data.tokenizer}); {t.max_iters} steps of batch {t.batch_size}, lr {t.lr}, "
             f"seed {t.seed}, eval every {t.eval_interval} steps on {t.eval_iters} batches")
    env = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "threads": torch.get_num_threads(), "cost_device": cost_device}
    paths = {}
    sections = ["# Attention ablation", "", f"Setup: {setup}. Environment: torch {env['torch']}, "
                f"{env['threads']} CPU threads. Times are wall-clock and noisy on a shared machine.", ""]
    if variants:
        title = (f"{m.n_layer} layers x {m.n_head} heads, d_model {m.n_embd}, block {m.block_size}{extras}; "
                 f"{t.max_iters} steps of {t.batch_size} sequences, seed {t.seed}, {base.data.source} "
                 f"({base.data.tokenizer}); same data, seed and steps for every variant")
        paths["ablation_png"] = save(plot_variants(variants, title), out / "ablation.png")
        sections += ["## Scaled vs unscaled vs additive attention", "", variants_table(variants), "",
                     "Entropy: mean over heads of attention entropy / ln(visible keys) on a fixed probe text, at "
                     "the last eval (1 = uniform, 0 = one-hot). Train s: optimizer steps only, evals excluded.",
                     "", "![ablation](ablation.png)", ""]
    if saturation:
        paths["saturation_png"] = save(plot_saturation(saturation), out / "saturation.png")
        sections += ["## Softmax saturation", "", saturation_table(saturation), "", "![saturation](saturation.png)", ""]
    if cost:
        paths["cost_png"] = save(plot_cost(cost, cost_mode, cost_device), out / "attention_cost.png")
        sections += [f"## Explicit vs fused attention ({cost_mode}, {cost_device}, float32, causal)", "",
                     cost_table(cost), "", _memory_note(cost[0]["memory_method"]), "",
                     "![attention cost](attention_cost.png)", ""]
    paths["results_md"] = out / "results.md"
    write_text_atomic(paths["results_md"], "\n".join(sections))
    paths["results_json"] = out / "results.json"
    payload = {"setup": setup, "config": base.to_dict(), "environment": env, "variants": variants,
               "saturation": saturation, "cost": {"mode": cost_mode, "device": cost_device, "rows": cost}}
    write_text_atomic(paths["results_json"], json.dumps(json_safe(payload), indent=1) + "\n")
    return paths


def _model_extras(base: RunConfig) -> dict:
    """Model options other than the size that differ from the built-in defaults (e.g. qk_norm): a reader of the
    table needs them, and the ablation's own switches (attention, scaled) are the variants, not the setup."""
    default = type(base.model)()
    skip = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size", "attention", "scaled", "bias"}
    return {k: v for k, v in vars(base.model).items() if k not in skip and getattr(default, k) != v}


def _memory_note(method: str) -> str:
    if method.startswith("torch.cuda"):
        return "Peak memory: torch.cuda.max_memory_allocated during the call, minus what was allocated before it."
    return ("Peak memory (CPU has no allocator statistics): the most bytes the call held at once, from "
            "torch.profiler's memory records (`cpu_peak_bytes` in experiments/attention_cost.py), each op's "
            "allocations counted at its start and its frees at its end (an upper bound at op granularity); tensors "
            "saved for backward are included, the inputs are not.")


