"""The seeds' lessons as one reproducible experiment (`python -m scripts.ablate`).

Three measurements, each usable on its own:
- `run_variants`: one small GPT trained three times on the same data, seed and step budget, with scaled
  dot-product, unscaled dot-product and additive (Bahdanau) attention. Val loss and the mean normalised attention
  entropy come from each run's metrics.jsonl, where the trainer's attention probe writes them at every eval.
- `softmax_saturation`: random unit-variance q and k, so q.k has variance d_k; softmax with and without the
  1/sqrt(d_k) factor. Without it the weights go one-hot as d_k grows and the softmax gradient vanishes.
- `attention_cost`: time and peak memory of the explicit formula (which materialises the [B, H, T, T] scores)
  against torch's fused kernel (which does not), as the sequence length T grows.
`write_results` turns them into results.md, results.json and three PNGs.
"""
from __future__ import annotations

import copy
import json
import math
import platform
import sys
import time
import weakref
from pathlib import Path
from typing import Callable

import torch
from matplotlib.figure import Figure
from tqdm import tqdm
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from model.attention import causal_mask, fused_attention, scaled_dot_product_attention
from train.config import RunConfig

VARIANTS = ("scaled", "unscaled", "additive")
LABELS = {"scaled": "scaled dot-product", "unscaled": "unscaled dot-product", "additive": "additive (Bahdanau)"}
COLORS = {"scaled": "tab:blue", "unscaled": "tab:red", "additive": "tab:green"}


# --- (1) three attention variants, one budget ----------------------------------------------------------------

def variant_config(base: RunConfig, variant: str, out_dir: str | Path) -> RunConfig:
    """`base` with the variant's attention; everything else (data, seed, steps, model size) stays the same.

    Both dot-product variants use the base's path (sdpa or manual: the same numbers); `scaled` is ignored by
    the additive scorer, which learns its own score scale through v.
    """
    if variant not in VARIANTS:
        raise ValueError(f"--variants: {variant!r} is not one of {', '.join(VARIANTS)}")
    cfg = copy.deepcopy(base)
    dot = base.model.attention if base.model.attention != "additive" else "sdpa"
    cfg.model.attention = "additive" if variant == "additive" else dot
    cfg.model.scaled = variant != "unscaled"
    cfg.train.out_dir = str(Path(out_dir) / variant)
    cfg.train.resume, cfg.train.overwrite = "never", True  # a rerun replaces the previous ablation
    cfg.log.attention = True  # the entropy curve comes from the trainer's probe
    if cfg.log.wandb and not cfg.log.wandb_run_name:
        cfg.log.wandb_run_name = f"ablation-{variant}"
    return cfg


def check_budget(cfg: RunConfig) -> None:
    """The comparison is fair only at a fixed step budget: a wall-clock one would give slower scorers fewer steps."""
    if cfg.train.max_seconds:
        raise ValueError(f"train.max_seconds: {cfg.train.max_seconds} - the ablation compares variants at a fixed "
                         "step budget; set --train.max_seconds 0 and choose --train.max_iters")


def ensure_probe(cfg: RunConfig) -> None:
    """Fix the attention probe before the variants run, so every variant sees the same one."""
    from data.prepare import prepare
    from data.tokenizers import load_tokenizer
    from train.evaluation import probe_text

    prepare(cfg.data)
    cfg.log.probe_prompt = probe_text(cfg, load_tokenizer(cfg.data.dir))


def run_variant(cfg: RunConfig, variant: str) -> dict:
    """Train one variant and read its curves back. A run that diverges (non-finite loss) is recorded, not fatal."""
    from inspector.curves import read_metrics, series
    from train.loop import train

    t0 = time.perf_counter()
    diverged = None
    try:
        summary = train(cfg)
    except RuntimeError as e:
        if "non-finite loss" not in str(e):
            raise
        summary, diverged = {}, str(e).split(";")[0]
    if summary.get("stopped") == "signal":  # Ctrl-C stops the whole ablation, not just this variant
        raise KeyboardInterrupt
    records = read_metrics(cfg.train.out_dir)
    steps, val = series(records, "val/loss")
    ent_steps, ent = series(records, "attn/mean_entropy_norm")
    elapsed = [r["elapsed_s"] for r in records if isinstance(r.get("elapsed_s"), (int, float))]
    nan = float("nan")
    return {"variant": variant, "label": LABELS[variant], "attention": cfg.model.attention,
            "scaled": cfg.model.scaled, "steps": steps.tolist(), "val_loss": val.tolist(),
            "entropy_steps": ent_steps.tolist(), "entropy": ent.tolist(),
            "final_val": float(val[-1]) if val.size else nan, "best_val": float(val.min()) if val.size else nan,
            "final_entropy": float(ent[-1]) if ent.size else nan,
            "train_seconds": float(summary.get("elapsed_s", elapsed[-1] if elapsed else nan)),
            "wall_seconds": time.perf_counter() - t0, "diverged": diverged, "out_dir": cfg.train.out_dir}


def run_variants(base: RunConfig, out_dir: str | Path, variants: tuple[str, ...] = VARIANTS,
                 log: Callable[[str], None] = print) -> list[dict]:
    """Train each variant in turn (same data, seed, steps) into out_dir/<variant>; returns one dict per variant."""
    check_budget(base)
    base = copy.deepcopy(base)
    ensure_probe(base)
    results = []
    for variant in tqdm(variants, desc="ablation variants", unit="run", file=sys.stderr):
        log(f"== {LABELS[variant]}: {base.train.max_iters} steps -> {Path(out_dir) / variant}")
        results.append(run_variant(variant_config(base, variant, out_dir), variant))
    return results


# --- (2) softmax saturation ----------------------------------------------------------------------------------

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


# --- (3) explicit vs fused attention cost --------------------------------------------------------------------

class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of tensor storages that ops create inside the block and that are alive at the same time.

    The CPU stand-in for torch.cuda.max_memory_allocated (CPU has no allocator statistics): it sees every tensor
    an op returns, including those autograd saves for backward, but not a kernel's private scratch buffers (the
    fused kernel's per-thread tiles, O(T) not O(T^2)). Outputs that share an input's storage (views, in-place) are
    not new memory and are skipped.
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._keys: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self._keys.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._keys:
                continue
            self._keys.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, nbytes)
        return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(fn: Callable[[], object], device: torch.device) -> tuple[int, str]:
    """Peak memory the call adds above what was allocated before it, and how it was measured."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = fn()
        _sync(device)
        del result
        return torch.cuda.max_memory_allocated(device) - base, "torch.cuda.max_memory_allocated"
    with LiveTensorBytes() as meter:
        result = fn()
        del result
    return meter.peak, "live op outputs, CPU"


def attention_cost(lengths: tuple[int, ...] = (128, 256, 512, 1024, 2048), heads: int = 4, head_dim: int = 64,
                   batch: int = 1, backward: bool = True, repeats: int = 3, device: str = "cpu",
                   seed: int = 0, atol: float = 1e-4, min_seconds: float = 0.25) -> list[dict]:
    """Per T: time per call (the fastest of at least `repeats` calls, more until `min_seconds` have passed: the
    fastest is the call least disturbed by other processes on a shared machine), peak memory and output agreement of the explicit causal formula and the fused
    kernel, at fixed batch, heads and head size (float32). `backward` times forward + backward (training).

    The two paths are checked against each other on every T (output and, with backward, the q/k/v gradients);
    a difference above `atol` raises, since then the timings would compare different computations.
    """
    dev = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for T in tqdm(lengths, desc="attention cost", unit="length", file=sys.stderr):
        Q, K, V, grad_out = (torch.randn(batch, heads, T, head_dim, generator=g).to(dev) for _ in range(4))
        for t in (Q, K, V):
            t.requires_grad_(backward)
        mask = causal_mask(T, device=dev)
        paths = {"explicit": lambda: scaled_dot_product_attention(Q, K, V, mask)[0],
                 "fused": lambda: fused_attention(Q, K, V, causal=True)}

        def call(path: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
            if not backward:
                with torch.no_grad():
                    return [path()]
            y = path()
            return [y.detach(), *torch.autograd.grad(y, (Q, K, V), grad_out)]

        row = {"T": T, "batch": batch, "heads": heads, "head_dim": head_dim,
               "score_bytes": batch * heads * T * T * 4}  # one float32 [B, H, T, T]: the O(T^2) term
        results = {name: call(path) for name, path in paths.items()}  # also the warm-up
        row["max_abs_diff"] = max((a - b).abs().max().item() for a, b in zip(results["explicit"], results["fused"]))
        if not row["max_abs_diff"] <= atol:
            raise RuntimeError(f"explicit and fused attention disagree at T={T}: max |diff| {row['max_abs_diff']:.2e}")
        del results
        for name, path in paths.items():
            times: list[float] = []
            while len(times) < repeats or (sum(times) < min_seconds and len(times) < 50):
                _sync(dev)
                t0 = time.perf_counter()
                call(path)
                _sync(dev)
                times.append(time.perf_counter() - t0)
            row[f"{name}_ms"], row[f"{name}_calls"] = 1000 * min(times), len(times)
            row[f"{name}_peak_bytes"], row["memory_method"] = _peak_bytes(lambda: call(path), dev)
        row["time_ratio"] = row["explicit_ms"] / row["fused_ms"]
        rows.append(row)
    return rows


# --- results: tables and figures -----------------------------------------------------------------------------

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
    paths["results_md"].write_text("\n".join(sections), encoding="utf-8")
    paths["results_json"] = out / "results.json"
    payload = {"setup": setup, "config": base.to_dict(), "environment": env, "variants": variants,
               "saturation": saturation, "cost": {"mode": cost_mode, "device": cost_device, "rows": cost}}
    paths["results_json"].write_text(json.dumps(_json_safe(payload), indent=1) + "\n", encoding="utf-8")
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
    return ("Peak memory (CPU has no allocator statistics): the most bytes of tensors that the call's ops created "
            "and held at the same time (`LiveTensorBytes` in train/ablation.py), tensors saved for backward "
            "included, a kernel's private scratch buffers not; the inputs are not counted.")


def _json_safe(obj):
    """NaN and infinities become null: results.json stays strict JSON that any reader accepts."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj
