"""scripts.ablate end to end: three variants, softmax saturation, explicit vs fused cost, the tables and figures.

No timing assertions: speed lives in the benchmark's output, not in tests.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from experiments.variants import LABELS

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
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
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
    for label in LABELS.values():
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
