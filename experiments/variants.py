"""Scaled dot-product, unscaled dot-product and additive (Bahdanau) attention: one small GPT trained three times on
the same data, seed and step budget. Val loss and the mean normalised attention entropy come from each run's
metrics.jsonl, where the trainer's attention probe writes them at every eval.

Imports nothing heavy at the top, so `scripts.ablate -h` can list the variants from here without loading torch.
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tqdm import tqdm

from model.param_error import ParamError

if TYPE_CHECKING:
    from train.config import RunConfig

VARIANTS = ("scaled", "unscaled", "additive")
LABELS = {"scaled": "scaled dot-product", "unscaled": "unscaled dot-product", "additive": "additive (Bahdanau)"}
COLORS = {"scaled": "tab:blue", "unscaled": "tab:red", "additive": "tab:green"}


def variant_config(base: RunConfig, variant: str, out_dir: str | Path) -> RunConfig:
    """`base` with the variant's attention; everything else (data, seed, steps, model size) stays the same.

    Both dot-product variants use the base's path (sdpa or manual: the same numbers); `scaled` is ignored by
    the additive scorer, which learns its own score scale through v.
    """
    if variant not in VARIANTS:
        raise ParamError("variant", f"{variant!r} is not one of {', '.join(VARIANTS)}")
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
                         "step budget; set train.max_seconds to 0 and choose train.max_iters")


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
