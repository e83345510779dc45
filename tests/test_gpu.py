"""CUDA code paths: bf16 autocast, fused AdamW, torch.compile, the flash/efficient kernels. Run by scripts/gpu_check.sh."""
import pytest
import torch

from model.config import ModelConfig
from model.gpt import GPT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _cfg(**kw):
    base = dict(vocab_size=512, block_size=256, n_layer=2, n_head=4, n_embd=128)
    base.update(kw)
    return ModelConfig(**base)


def test_fused_kernel_agrees_with_explicit_formula_on_cuda():
    torch.manual_seed(0)
    fused = GPT(_cfg()).cuda().eval()
    manual = GPT(_cfg(attention="manual")).cuda().eval()
    manual.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 512, (4, 256), device="cuda")
    with torch.no_grad():
        assert torch.allclose(fused(idx)[0], manual(idx)[0], rtol=1e-3, atol=1e-3)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            a, b = fused(idx)[0].float(), manual(idx)[0].float()
    assert (a - b).abs().max() < 0.1


def test_bf16_training_with_fused_adamw_and_compile_learns():
    from train.config import TrainConfig
    from train.optim import build_optimizer

    torch.manual_seed(0)
    model = GPT(_cfg()).cuda()
    opt = build_optimizer(model, TrainConfig(lr=3e-3), "cuda")
    assert opt.defaults.get("fused") is True
    step_model = torch.compile(model)
    x = torch.randint(0, 512, (8, 256), device="cuda")
    first = None
    for _ in range(60):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = step_model(x, torch.roll(x, -1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        first = first or loss.item()
    assert loss.item() < first - 2.0


def test_kv_cache_decode_matches_full_forward_on_cuda():
    from model.kv_cache import KVCache

    torch.manual_seed(0)
    model = GPT(_cfg(positions="rope", n_kv_head=2)).cuda().eval()
    idx = torch.randint(0, 512, (2, 40), device="cuda")
    cache = KVCache(model.config, 2, device="cuda")
    with torch.no_grad():
        full, _ = model(idx)
        model(idx[:, :20], cache=cache)
        steps = [model(idx[:, t:t + 1], cache=cache)[0][:, 0] for t in range(20, 40)]
    assert torch.allclose(torch.stack(steps, 1), full[:, 20:], atol=1e-4)


def test_loader_on_cuda_gives_the_cpu_batches(tiny_config):
    from data.loader import ShardLoader
    from data.prepare import prepare

    prepare(tiny_config.data, verbose=False)
    cpu = ShardLoader(tiny_config.data.dir, "train", 4, 32, seed=3, micro_steps=2)
    gpu = ShardLoader(tiny_config.data.dir, "train", 4, 32, seed=3, device="cuda", micro_steps=2)
    batches = gpu.batches(5)
    for step, micro in [(5, 0), (5, 1), (6, 0)]:
        x, y = next(batches)
        assert x.is_cuda and y.is_cuda
        ex, ey = cpu.get_batch(step, micro)
        assert torch.equal(x.cpu(), ex) and torch.equal(y.cpu(), ey)


def test_training_forward_on_cuda_takes_full_logits_without_returning_them():
    torch.manual_seed(0)
    model = GPT(_cfg()).cuda()
    idx = torch.randint(0, 512, (4, 256), device="cuda")
    none, loss = model(idx, torch.roll(idx, -1, 1), return_logits=False)
    _, reference = model(idx, torch.roll(idx, -1, 1))
    assert none is None and "Chunked" not in type(loss.grad_fn).__name__
    assert torch.allclose(loss, reference)


def test_trainer_on_cuda_resumes_with_its_own_gpus_rng_and_restores_fp32_precision(tiny_config):
    import json
    from pathlib import Path

    from model.checkpoint import load_trainer_state
    from train.loop import train

    before = torch.get_float32_matmul_precision()
    tiny_config.train.device, tiny_config.train.dtype, tiny_config.train.stop_at = "cuda", "auto", 10
    assert train(tiny_config)["step"] == 10
    assert torch.get_float32_matmul_precision() == before
    state = load_trainer_state(Path(tiny_config.train.out_dir) / "latest")
    assert isinstance(state["rng"]["cuda"], torch.Tensor) and state["device_type"] == "cuda"
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert state["dtype"] == ("bfloat16" if native else "float16")
    tiny_config.train.stop_at, tiny_config.train.resume = 0, "auto"
    assert train(tiny_config)["step"] == 20
    rows = [json.loads(line) for line in (Path(tiny_config.train.out_dir) / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert losses[-1] < losses[0]
