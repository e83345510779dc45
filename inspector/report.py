"""One call per use: `inspect_attention` (the script: every output file) and `probe_attention` (the trainer: cheap,
called at each eval). Both capture the prompt's attention plus the same heads on a repeated random block, which
is what the induction score is measured on.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from data.atomic import atomic_file, write_text_atomic
from inspector import plots
from inspector.capture import Capture, capture_attention, repeated_random_tokens, token_strings
from inspector.stats import STAT_KEYS, THRESHOLDS, head_stats, summary_scalars
from inspector.viewer import render_viewer
from model.eval_mode import eval_mode
from model.inference import SamplingSettings, generate as generate_tokens
from model.param_error import ParamError
from model.text_stream import encode_prompt

DEFAULT_PROBE = ("ROMEO:\nBut soft, what light through yonder window breaks?\n"
                 "It is the east, and Juliet is the sun.\n")
INDUCTION_BLOCK = 40  # random tokens per copy of the induction probe (capped at block_size // 2 and the vocab)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _check_indices(name: str, chosen: list[int] | None, count: int) -> list[int]:
    if chosen is None:
        return list(range(count))
    if not chosen:
        raise ParamError(name, "give at least one index")
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise ParamError(name, f"{bad[0]} out of range 0..{count - 1}")
    return sorted(set(chosen))


def capture(model: nn.Module, tokenizer, ids: list[int], layers: list[int] | None = None,
            heads: list[int] | None = None, n_prompt: int | None = None, seed: int = 0) -> Capture:
    """Capture the chosen heads on `ids` and on the induction probe, with the model in eval mode for the
    duration (and put back in training mode after, if it was)."""
    config = model.config
    layers = _check_indices("layers", layers, config.n_layer)
    heads = _check_indices("heads", heads, config.n_head)
    if len(ids) < 2:
        raise ValueError(f"attention needs at least 2 tokens, got {len(ids)}")
    if len(ids) > config.block_size:
        raise ValueError(f"{len(ids)} tokens do not fit the model's block_size {config.block_size}")
    device = _device(model)
    with eval_mode(model):
        _, w = capture_attention(model, torch.tensor([ids], device=device), layers)
        vocab = min(config.vocab_size, getattr(tokenizer, "vocab_size", 0) or config.vocab_size)
        block = min(INDUCTION_BLOCK, config.block_size // 2, vocab)  # distinct tokens: one "last occurrence"
        repeat_ids, repeat = [], None
        if block >= 2:
            repeat_ids = repeated_random_tokens(vocab, block, seed)
            _, rw = capture_attention(model, torch.tensor([repeat_ids], device=device), layers)
            repeat = rw[:, 0][:, heads].numpy()
    return Capture(weights=w[:, 0][:, heads].numpy(), token_ids=list(ids), tokens=token_strings(tokenizer, ids),
                   layers=layers, heads=heads, repeat_weights=repeat, repeat_ids=repeat_ids,
                   n_prompt=len(ids) if n_prompt is None else n_prompt)


def stats_of(cap: Capture) -> list[dict]:
    return head_stats(cap.weights, cap.layers, cap.heads, cap.repeat_weights, len(cap.repeat_ids) // 2)


def write_stats(stats: list[dict], out_dir: str | Path, extra: dict | None = None) -> dict[str, Path]:
    """head_stats.json (the rows plus how they were measured) and head_stats.csv (one row per head)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"thresholds": {name: {"score": key, "min": value} for name, (key, value) in THRESHOLDS.items()},
            "label_order": list(THRESHOLDS) + ["mixed"], **(extra or {})}
    json_path, csv_path = out / "head_stats.json", out / "head_stats.csv"
    write_text_atomic(json_path, json.dumps({**meta, "heads": stats}, indent=1) + "\n")  # the film reads it
    with atomic_file(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["layer", "head", "label", *STAT_KEYS])
        writer.writeheader()
        writer.writerows(stats)
    return {"head_stats_json": json_path, "head_stats_csv": csv_path}


def write_all(cap: Capture, stats: list[dict], out_dir: str | Path, title: str, subtitle: str) -> dict[str, Path]:
    """Every output of the inspector into `out_dir`; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"grid_png": plots.save(plots.plot_grid(cap.weights, cap.tokens, cap.layers, cap.heads, stats, title),
                                    out / "attention_grid.png")}
    for li, layer in enumerate(cap.layers):
        fig = plots.plot_layer(cap.weights[li], cap.tokens, layer, cap.heads, stats)
        paths[f"layer{layer}_png"] = plots.save(fig, out / f"attention_layer{layer}.png")
    paths["scores_png"] = plots.save(plots.plot_head_scores(stats), out / "head_scores.png")
    html_path = out / "attention.html"
    html_path.write_text(render_viewer(cap.weights, cap.tokens, cap.layers, cap.heads, stats, title, subtitle,
                                       cap.n_prompt), encoding="utf-8")
    paths["html"] = html_path
    paths.update(write_stats(stats, out, {"tokens": cap.tokens, "token_ids": cap.token_ids,
                                          "induction_block": len(cap.repeat_ids) // 2}))
    npz = out / "attention.npz"
    np.savez_compressed(npz, weights=cap.weights.astype(np.float32), tokens=np.array(cap.tokens, dtype=str),
                        token_ids=np.array(cap.token_ids), layers=np.array(cap.layers), heads=np.array(cap.heads),
                        n_prompt=cap.n_prompt,
                        repeat_weights=(cap.repeat_weights if cap.repeat_weights is not None
                                        else np.zeros((0,), np.float32)).astype(np.float32),
                        repeat_ids=np.array(cap.repeat_ids, dtype=np.int64))
    paths["npz"] = npz
    return paths


def inspect_attention(model: nn.Module, tokenizer, prompt: str, out_dir: str | Path, generate: int = 0,
                      layers: list[int] | None = None, heads: list[int] | None = None, max_tokens: int = 128,
                      temperature: float = 0.0, seed: int = 0, title: str = "attention") -> dict:
    """Generate `generate` tokens after `prompt` (optional), capture one forward over prompt + continuation (its
    last `max_tokens` tokens, at most block_size), and write every output. Returns {"paths", "stats", "capture"}.
    """
    if max_tokens < 2:
        raise ParamError("max_tokens", f"{max_tokens} must be at least 2")
    if generate < 0:
        raise ParamError("generate", f"{generate} must be >= 0")
    if not prompt and not generate:
        raise ParamError("prompt", "empty prompt; give some text to look at, or {generate} N tokens to look at",
                         mentions=("generate",))
    ids = encode_prompt(tokenizer, prompt)  # empty with generate: the tokenizer's start token
    if len(ids) + generate < 2:
        raise ParamError("prompt", f"{len(ids)} token: attention needs at least 2 tokens; give a longer {{prompt}} "
                         "or {generate} N", mentions=("prompt", "generate"))
    n_prompt = len(ids)
    block = model.config.block_size
    if generate:
        out = generate_tokens(model, ids, generate, SamplingSettings(temperature=temperature), seed=seed,
                              vocab_limit=tokenizer.vocab_size)
        ids = out[0].tolist()
    keep = min(max_tokens, block)
    dropped = max(0, len(ids) - keep)
    ids = ids[dropped:]
    cap = capture(model, tokenizer, ids, layers, heads, n_prompt=max(0, n_prompt - dropped), seed=seed)
    stats = stats_of(cap)
    c = model.config
    subtitle = (f"{len(ids)} tokens ({cap.n_prompt} from the prompt, {len(ids) - cap.n_prompt} generated"
                + (f"; the first {dropped} dropped to fit max_tokens/block_size" if dropped else "")
                + f") \u00b7 model: {c.n_layer} layers \u00d7 {c.n_head} heads, d_model {c.n_embd}, "
                f"block {c.block_size}")
    paths = write_all(cap, stats, out_dir, title, subtitle)
    return {"paths": paths, "stats": stats, "capture": cap, "dropped": dropped}


def probe_attention(model: nn.Module, tokenizer, text: str = "", out_dir: str | Path | None = None,
                    max_tokens: int = 64) -> dict:
    """For the trainer, at each eval: two small forwards (the probe text and the induction probe), no generation.

    Returns {"stats": per-head dicts, "scalars": {"attn/max_induction", "attn/max_prev_token",
    "attn/mean_entropy_norm"}, "figure": the layers x heads grid (matplotlib Figure), "scores_figure": the
    head-score heatmaps, "capture": the Capture itself, "paths": the PNGs and head_stats.json/csv written into
    out_dir (empty without one)}.
    Pass the bare model (not a DDP or torch.compile wrapper) so the hooks reach the attention modules.
    """
    ids = encode_prompt(tokenizer, text or DEFAULT_PROBE)[: min(max_tokens, model.config.block_size)]
    cap = capture(model, tokenizer, ids)
    stats = stats_of(cap)
    figure = plots.plot_grid(cap.weights, cap.tokens, cap.layers, cap.heads, stats)
    scores_figure = plots.plot_head_scores(stats)
    paths: dict[str, Path] = {}
    if out_dir is not None:
        paths["grid_png"] = plots.save(figure, Path(out_dir) / "attention_grid.png")
        paths["scores_png"] = plots.save(scores_figure, Path(out_dir) / "head_scores.png")
        paths.update(write_stats(stats, out_dir, {"tokens": cap.tokens}))
    return {"stats": stats, "scalars": summary_scalars(stats), "figure": figure, "scores_figure": scores_figure,
            "capture": cap, "paths": paths}


def wandb_media(result: dict, prefix: str = "attn") -> dict:
    """wandb objects for a `probe_attention` result: the grid and score images and the head-statistics table.

    For `Tracker.log_media(step, ...)`; scalars go through the ordinary metrics path (`result["scalars"]`).
    """
    import wandb  # lazily: only runs that log to wandb pay for the import

    columns = ["layer", "head", "label", *STAT_KEYS]
    table = wandb.Table(columns=columns, data=[[s.get(c) for c in columns] for s in result["stats"]])
    return {f"{prefix}/grid": wandb.Image(plots.to_array(result["figure"]), caption="layers x heads"),
            f"{prefix}/head_scores": wandb.Image(plots.to_array(result["scores_figure"])),
            f"{prefix}/head_stats": table}
