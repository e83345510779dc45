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
