"""Device and precision choices (CUDA ones faked on CPU), data-sheet peaks, and the training benchmark script."""
from __future__ import annotations

import datetime
import time

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


@pytest.mark.parametrize("product_s, side", [(0.02, 128), (1e-6, 512)])
def test_matmul_peak_grows_the_product_only_while_it_stays_within_budget(monkeypatch, product_s, side):
    """A slow dtype (bf16 on a CPU without bf16 units) is measured on a small product, a fast one on the full
    size: with a clock on which every timed interval lasts `product_s`, the figure says which side was timed."""
    ticks = iter(range(1000))
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: next(ticks) * product_s)
    assert measure_matmul_flops(CPU, 512, 2, budget_s=0.1) == pytest.approx(2 * side ** 3 * 2 / product_s)


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


# --- CUDA conditions, faked on CPU ---------------------------------------------------------------------------------

def fake_cuda(monkeypatch, devices: int = 2, bf16_native: bool = True) -> list:
    """torch.cuda as on a machine with `devices` GPUs; returns the list that records set_device calls."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(torch.device(d)))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16_native or
                        including_emulation)
    return calls


def test_torchrun_puts_each_rank_on_cuda_local_rank(monkeypatch):
    fake_cuda(monkeypatch, devices=2)
    for asked in ("cuda", "cuda:0", "auto"):
        assert runtime.pick_device(asked, 1, distributed=True) == torch.device("cuda", 1)
    assert runtime.pick_device("cuda:1", 0) == torch.device("cuda", 1)  # one process: the index asked for
    with pytest.raises(ValueError, match="LOCAL_RANK 2 needs cuda:2, but only 2"):
        runtime.pick_device("cuda", 2, distributed=True)
    with pytest.raises(ValueError, match="cuda:5 asked for, but only 2"):
        runtime.pick_device("cuda:5", 0)


@pytest.fixture
def keep_matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield before
    torch.set_float32_matmul_precision(before)


def test_setup_under_torchrun_binds_the_local_gpu_with_a_long_timeout_and_tf32(monkeypatch, capsys,
                                                                                keep_matmul_precision):
    set_device = fake_cuda(monkeypatch, devices=2)
    joined: list[dict] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "1")  # rank 0 of this run on a node's second GPU
    monkeypatch.setattr(runtime.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.dist, "init_process_group", lambda **kw: joined.append(kw))
    before = keep_matmul_precision
    rt = runtime.setup("cuda:0", "float32", 768)
    assert rt.device == torch.device("cuda", 1) and set_device == [torch.device("cuda", 1)]
    assert joined == [{"backend": "nccl", "timeout": datetime.timedelta(hours=1)}]
    assert "cuda:0 is ignored under torchrun" in capsys.readouterr().err
    assert torch.get_float32_matmul_precision() == "high"  # TF32 for fp32 matmuls
    from train.parallel import ddp_options

    assert ddp_options(rt) == {"device_ids": [1], "gradient_as_bucket_view": True, "broadcast_buffers": False}
    runtime.teardown(rt)
    assert torch.get_float32_matmul_precision() == before  # exact comparisons elsewhere see fp32 again
    runtime.setup("cuda", "float32", 768, timeout_s=90)
    assert joined[-1]["timeout"] == datetime.timedelta(seconds=90)


def test_dist_timeout_must_be_positive():
    from train.config import TrainConfig

    with pytest.raises(ValueError, match="train.dist_timeout"):
        TrainConfig(dist_timeout=0).validate()


@pytest.mark.parametrize("native", [True, False])
def test_cuda_auto_dtype_is_bf16_only_where_native(monkeypatch, native):
    fake_cuda(monkeypatch, bf16_native=native)  # emulated bf16 "is supported" either way
    expected = torch.bfloat16 if native else torch.float16
    assert pick_dtype("auto", torch.device("cuda", 0), 768) == expected
    rt = runtime.Runtime(device=torch.device("cuda", 0), dtype=expected)
    assert rt.needs_grad_scaler() == (not native)


@pytest.mark.parametrize("native", [True, False])
def test_inference_auto_follows_the_same_rule_on_cuda_and_stays_fp32_on_cpu(monkeypatch, native):
    """The scripts that cast the weights (sample, evaluate, serve) ask the same function, autocast=False."""
    fake_cuda(monkeypatch, bf16_native=native)
    monkeypatch.setattr(runtime, "cpu_has_amx", lambda: True)
    cuda = torch.device("cuda", 0)
    assert pick_dtype("auto", cuda, autocast=False) == pick_dtype("auto", cuda, 768)
    assert pick_dtype("auto", CPU, 768, autocast=False) == torch.float32  # bf16 weights decode no faster on CPU
    assert pick_dtype("auto", CPU, 768) == torch.bfloat16  # while the trainer's autocast there pays
    assert pick_dtype("float16", CPU, autocast=False) == torch.float16  # cast weights may be fp16 anywhere
    with pytest.raises(ValueError, match="^--dtype: 'int4' is not one of auto, float32"):
        pick_dtype("int4", CPU, autocast=False, option="--dtype")


def test_the_inference_scripts_place_models_through_it(monkeypatch):
    from scripts.inference_args import placement

    calls = []
    real = runtime.pick_dtype
    monkeypatch.setattr(runtime, "pick_dtype", lambda *a, **kw: (calls.append(kw), real(*a, **kw))[1])
    assert placement("cpu", "auto") == (CPU, torch.float32)
    assert calls == [{"autocast": False, "option": "--dtype"}]


def test_a_resumed_run_keeps_its_dtype_only_on_the_same_kind_of_device(monkeypatch):
    cpu_fp32 = runtime.Runtime(device=CPU, dtype=torch.float32)
    kept = {"dtype": "bfloat16", "device_type": "cpu"}
    assert runtime.resumed_dtype(kept, cpu_fp32, "auto") == torch.bfloat16
    assert runtime.resumed_dtype(kept, cpu_fp32, "float32") == torch.float32  # an explicit dtype wins
    assert runtime.resumed_dtype({"dtype": "bfloat16", "device_type": "cuda"}, cpu_fp32, "auto") == torch.float32
    assert runtime.resumed_dtype({"dtype": "bfloat16"}, cpu_fp32, "auto") == torch.float32  # kind unknown: re-pick
    fake_cuda(monkeypatch, bf16_native=False)
    gpu_fp16 = runtime.Runtime(device=torch.device("cuda", 0), dtype=torch.float16)
    assert runtime.resumed_dtype({"dtype": "bfloat16", "device_type": "cuda"}, gpu_fp16, "auto") == torch.float16


def test_datasheet_peaks_are_matched_by_exact_name(monkeypatch):
    bf16 = torch.bfloat16
    expected = {"NVIDIA H100 80GB HBM3": 989.4e12, "NVIDIA H100 PCIe": 756.5e12, "NVIDIA H100 NVL": 835.5e12,
                "NVIDIA H200": 989.4e12, "NVIDIA H200 NVL": 835.5e12, "NVIDIA A100-SXM4-80GB": 312e12,
                "NVIDIA A100 80GB PCIe": 312e12, "NVIDIA L4": 121e12, "NVIDIA L40": 181.05e12,
                "NVIDIA L40S": 362.05e12, "NVIDIA B200": 2250e12}
    for name, flops in expected.items():
        assert runtime.datasheet_peak(name, bf16)[0] == flops, name
    assert runtime.datasheet_peak("NVIDIA H100 PCIe", torch.float32)[0] == 756.5e12 / 2  # TF32
    for unknown in ("NVIDIA H100", "NVIDIA L40G", "NVIDIA GeForce RTX 4090", "Tesla T4"):  # no substring matches
        peak, source = runtime.datasheet_peak(unknown, bf16)
        assert peak == 0.0 and "unknown GPU" in source
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 NVL")
    assert runtime.peak_flops(torch.device("cuda", 0), bf16)[0] == 835.5e12


PROC_STAT = """cpu  900 0 100 5000 0 0 0 0 0 0
cpu0 500 0 50 2500 10 0 0 5 0 0
cpu1 400 0 50 2500 0 0 0 0 0 0
intr 12345
"""


def test_cpu_ticks_reads_busy_and_all_ticks_per_cpu(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(PROC_STAT)
    # busy: user + nice + system + irq + softirq + steal; idle and iowait are not busy
    assert runtime.cpu_ticks(str(stat)) == {0: (555, 3065), 1: (450, 2950)}


def test_cores_busy_elsewhere_counts_usable_cpus_and_leaves_out_this_process(monkeypatch):
    import os
    hz = os.sysconf("SC_CLK_TCK")
    reads = iter([{0: (0, 0), 1: (0, 0), 7: (0, 0)},
                  {0: (hz, hz), 1: (hz // 2, hz), 7: (hz, hz)}])  # cpu 7 lies outside the affinity set
    times = iter([os.times_result((0.0, 0.0, 0, 0, 0)), os.times_result((0.4, 0.1, 0, 0, 0))])
    monkeypatch.setattr(runtime, "cpu_ticks", lambda path: next(reads))
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(runtime.os, "times", lambda: next(times))
    busy = runtime.cores_busy_elsewhere(interval=1.0)
    # 1.5 CPU-seconds busy on cpus 0 and 1 over ~1 s, 0.5 of them this process's own
    assert 0.9 < busy <= 1.0


def test_cores_busy_elsewhere_sees_a_busy_process_and_is_none_without_proc_stat(tmp_path):
    import subprocess
    import sys
    spin = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        assert runtime.cores_busy_elsewhere(interval=0.5) >= 0.5
    finally:
        spin.kill()
        spin.wait()
    assert runtime.cores_busy_elsewhere(interval=0.0, path=str(tmp_path / "missing")) is None
