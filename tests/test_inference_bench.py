"""The decoding benchmark runs and its decoders agree (the numbers themselves are for the README, not for tests)."""
from __future__ import annotations

import pytest

from tests.inference_fixtures import run_script


@pytest.mark.slow
def test_bench_decode_prints_all_decoders_and_they_agree():
    pytest.importorskip("transformers")
    res = run_script("scripts.bench_decode", "--new-tokens", "3", "--threads", "1", "--skip-sampling", "--rounds", "2",
                     timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith(("attngpt", "transformers"))]
    names = [r[:38].strip() for r in rows]
    assert names == ["attngpt cached, greedy", "attngpt cached, int8, greedy", "attngpt full recompute, greedy",
                     "transformers generate(), greedy"]
    fp32 = [r for name, r in zip(names, rows) if "int8" not in name]
    assert all(r.rstrip().endswith("yes") for r in fp32)  # greedy: every fp32 decoder produced the same tokens
    assert rows[1].rstrip().endswith("equal") and "/3 prefix" in rows[1]  # int8 is compared, not required equal
    floor = [line for line in res.stdout.splitlines() if line.startswith(("floor", "int8 floor"))]
    assert len(floor) == 2 and all("GB/s" in f for f in floor)
    assert "(0.49 GB" in floor[0] and "(0.12 GB" in floor[1]  # int8 weights: a quarter of the bytes
    assert "cached greedy decode / transformers generate(): " in res.stdout and "x at 3" in res.stdout
    assert "int8 cached decode / fp32 cached decode" in res.stdout and "its floor's" in res.stdout


def test_bench_decode_rejects_bad_rounds():
    res = run_script("scripts.bench_decode", "--rounds", "0", timeout=120)
    assert res.returncode == 2 and "--rounds" in res.stderr and "Traceback" not in res.stderr


def test_timers_wait_for_the_device_and_sampling_draws_there(monkeypatch):
    """--device cuda: kernels run asynchronously, so every timer read must follow a sync; the sampler's generator
    must live on the model's device. Faked on CPU: the sync is recorded, the generator's device checked."""
    import torch

    from model.inference import SamplingSettings
    from scripts import bench_decode
    from tests.inference_fixtures import tiny_model

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    cuda = torch.device("cuda")
    bench_decode.clock(cuda)
    bench_decode.clock(torch.device("cpu"))
    assert synced == [cuda]  # CPU work is synchronous: no sync there
    stream = iter([torch.tensor([1]), torch.tensor([2])])
    first, total, toks = bench_decode.time_stream(stream, cuda)
    assert len(synced) == 4 and 0 <= first <= total and len(toks) == 2  # start, first token, end
    devices = []
    real = bench_decode.make_generator
    monkeypatch.setattr(bench_decode, "make_generator", lambda seed, device="cpu": devices.append(device) or
                        real(seed, device))
    idx = torch.randint(0, 40, (1, 4))
    bench_decode.ours(tiny_model(), idx, True, SamplingSettings(temperature=0.8))(3)
    assert devices == [idx.device]
