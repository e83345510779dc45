"""scripts.ablate and train.ablation: three variants end to end, softmax saturation, explicit vs fused cost.

No timing assertions: speed lives in the benchmark's output, not in tests.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train import ablation
from train.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_script_writes_tables_and_figures_for_three_variants(tmp_path, corpus_file):
    out = tmp_path / "ablation"
    cmd = [sys.executable, "-m", "scripts.ablate", "--out", str(out),
           "--data.source", "files", "--data.path", str(corpus_file), "--data.dir", str(tmp_path / "data"),
           "--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "16", "--model.block_size", "16",
           "--train.max_iters", "4", "--train.eval_interval", "2", "--train.eval_iters", "1",
           "--train.batch_size", "4", "--train.warmup_iters", "1", "--train.device", "cpu",
           "--saturation-dims", "16", "256", "--saturation-keys", "8",
           "--cost-lengths", "16", "32", "--cost-heads", "2", "--cost-head-dim", "8", "--cost-repeats", "1",
           "--threads", "1"]  # one thread: a tiny model gains nothing from more, and a busy machine stalls less
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("results.md", "results.json", "ablation.png", "saturation.png", "attention_cost.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = json.loads((out / "results.json").read_text())
    variants = {v["variant"]: v for v in results["variants"]}
    assert list(variants) == ["scaled", "unscaled", "additive"]
    for v in variants.values():
        assert v["steps"] == [2.0, 4.0] and v["entropy_steps"] == [2.0, 4.0]
        numbers = [v["final_val"], v["best_val"], v["final_entropy"], v["train_seconds"], *v["val_loss"]]
        assert all(isinstance(x, float) and math.isfinite(x) for x in numbers), v
        assert v["best_val"] == min(v["val_loss"]) and 0.0 <= v["final_entropy"] <= 1.0
    # each run really used its variant (the checkpoint's saved config), and all share the same budget and seed
    saved = {name: json.loads((out / name / "latest" / "config.json").read_text()) for name in variants}
    assert [saved[n]["model"]["scaled"] for n in variants] == [True, False, True]
    assert [saved[n]["model"]["attention"] for n in variants] == ["sdpa", "sdpa", "additive"]
    assert len({(s["train"]["max_iters"], s["train"]["seed"], s["data"]["dir"]) for s in saved.values()}) == 1

    table = (out / "results.md").read_text()
    for label in ablation.LABELS.values():
        assert label in table
    assert [r["d_k"] for r in results["saturation"]] == [16, 256]
    assert [r["T"] for r in results["cost"]["rows"]] == [16, 32]
    assert "| 32 |" in done.stdout  # the cost table is printed too


def test_script_rejects_a_wall_clock_budget():
    done = subprocess.run([sys.executable, "-m", "scripts.ablate", "--train.max_seconds", "30"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "train.max_seconds" in done.stderr


def test_help_shows_the_ablation_defaults():
    done = subprocess.run([sys.executable, "-m", "scripts.ablate", "-h"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "checkpoints/ablation" in text and "configs/ablation.toml" in text
    assert "(default: 6; ablation preset: 4)" in text  # model.n_layer: built-in default and what the preset sets


def test_variant_config_changes_only_the_attention():
    base = RunConfig()
    base.model.attention = "manual"
    cfgs = {v: ablation.variant_config(base, v, "out") for v in ablation.VARIANTS}
    assert [(c.model.attention, c.model.scaled) for c in cfgs.values()] == [
        ("manual", True), ("manual", False), ("additive", True)]
    assert cfgs["unscaled"].train.out_dir == str(Path("out") / "unscaled")
    for c in cfgs.values():
        c.model.attention, c.model.scaled, c.train.out_dir = "manual", True, base.train.out_dir
        c.train.overwrite, c.log.attention = base.train.overwrite, base.log.attention
        assert c.to_dict() == base.to_dict()
    assert base.model.scaled is True  # the base is not modified
    with pytest.raises(ValueError, match="is not one of"):
        ablation.variant_config(base, "cosine", "out")


def test_saturation_without_the_scale_goes_one_hot():
    rows = ablation.softmax_saturation(dims=(16, 1024), n_keys=64, n_queries=500)
    small, big = rows
    assert big["max_weight_unscaled"] > 0.9  # scores of std 32: almost one-hot
    assert big["max_weight_scaled"] < 0.3  # std 1 over 64 keys: well spread
    assert big["entropy_scaled"] > 3 * big["entropy_unscaled"]
    assert big["jacobian_unscaled"] < 0.5 * big["jacobian_scaled"]  # and the gradient through softmax vanishes
    assert small["max_weight_unscaled"] < big["max_weight_unscaled"]  # worse as d_k grows
    assert abs(small["max_weight_scaled"] - big["max_weight_scaled"]) < 0.05  # the scale makes d_k irrelevant
    assert big["score_std"] == pytest.approx(32, rel=0.1)


@pytest.mark.parametrize("backward", [True, False])
def test_cost_rows_hold_agreeing_paths_and_the_quadratic_term(backward):
    rows = ablation.attention_cost(lengths=(16, 64), heads=2, head_dim=8, batch=1, backward=backward, repeats=1,
                                   min_seconds=0.0)
    assert [r["T"] for r in rows] == [16, 64]
    for r in rows:
        assert r["max_abs_diff"] < 1e-5
        assert r["explicit_ms"] > 0 and r["fused_ms"] > 0
        assert r["score_bytes"] == 2 * r["T"] ** 2 * 4
        assert r["explicit_peak_bytes"] >= r["score_bytes"]  # the explicit path materialises [B, H, T, T]
    assert rows[-1]["fused_peak_bytes"] < rows[-1]["score_bytes"]  # the fused one never does


def test_cost_refuses_paths_that_disagree(monkeypatch):
    monkeypatch.setattr(ablation, "fused_attention", lambda Q, K, V, causal: V * 1.01)
    with pytest.raises(RuntimeError, match="disagree"):
        ablation.attention_cost(lengths=(8,), heads=1, head_dim=4, repeats=1, backward=False)


def test_live_tensor_bytes_counts_new_storage_once():
    x = torch.zeros(10)
    with ablation.LiveTensorBytes() as meter:
        a = torch.ones(1000)  # 4000 bytes, alive
        b = a.view(10, 100).t()  # views: no new memory
        x.add_(1)  # in place on an outside tensor: no new memory
        del a, b
        c = torch.ones(500)  # 2000 bytes after the first block was freed
    assert meter.peak == 4000 and meter.live == 2000
    del c
    assert meter.live == 0
