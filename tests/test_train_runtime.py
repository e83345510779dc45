"""Device and precision choices, and the training benchmark script end to end on a tiny model."""
from __future__ import annotations

import pytest
import torch

from tests.inference_fixtures import run_script
from train import runtime
from train.runtime import CPU_BF16_MIN_WIDTH, measure_matmul_flops, pick_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize("amx", [True, False])
def test_cpu_auto_dtype_is_bf16_only_for_wide_models_on_amx(monkeypatch, amx):
    monkeypatch.setattr(runtime, "cpu_has_amx", lambda: amx)
    assert pick_dtype("auto", CPU, CPU_BF16_MIN_WIDTH - 1) == torch.float32  # small models: casts cost more
    assert pick_dtype("auto", CPU, 768) == (torch.bfloat16 if amx else torch.float32)
    assert pick_dtype("auto", CPU) == torch.float32  # width unknown: the safe choice


def test_explicit_dtypes_win_and_fp16_on_cpu_is_refused(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_amx", lambda: True)
    assert pick_dtype("float32", CPU, 768) == torch.float32
    assert pick_dtype("bfloat16", CPU, 32) == torch.bfloat16
    with pytest.raises(ValueError, match="train.dtype: float16"):
        pick_dtype("float16", CPU, 768)


def test_matmul_peak_is_measured_in_the_asked_dtype_without_touching_the_global_rng():
    state = torch.get_rng_state()
    for dtype in (torch.float32, torch.bfloat16):
        assert measure_matmul_flops(CPU, 128, 2, dtype) > 0
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.slow
def test_bench_train_compares_both_loops(tmp_path, corpus_file):
    res = run_script("scripts.bench_train", "--config", "configs/tiny.toml", "--data.source", "files",
                     "--data.path", str(corpus_file), "--data.dir", str(tmp_path / "d"), "--steps", "2",
                     "--warmup", "1", "--rounds", "1", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines() if line.startswith(("plain", "trainer"))}
    assert set(rows) == {"plain", "trainer"}
    assert rows["plain"][1] == "fp32" and rows["trainer"][1] == "fp32"  # tiny width: auto stays fp32
    assert float(rows["plain"][2]) > 0 and rows["plain"][-1] == "1.00x" and rows["trainer"][-1].endswith("x")
    assert "fp32 ceiling" in res.stdout


def test_bench_train_bad_config_is_one_line():
    res = run_script("scripts.bench_train", "--config", "configs/no_such.toml", timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
