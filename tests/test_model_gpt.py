"""Whole-model properties: causality, learning, initialisation, counting."""
import itertools
import math

import pytest
import torch

from model.config import ModelConfig
from model.gpt import GPT


def _cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=41, block_size=24, n_layer=2, n_head=4, n_embd=32)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("positions,attention", list(itertools.product(["learned", "rope", "sinusoidal"],
                                                                         ["sdpa", "manual", "additive"])))
def test_changing_future_tokens_leaves_past_logits_unchanged(positions, attention):
    torch.manual_seed(0)
    model = GPT(_cfg(positions=positions, attention=attention, n_kv_head=2, qk_norm=True)).eval()
    idx = torch.randint(0, 41, (2, 24))
    with torch.no_grad():
        base, _ = model(idx)
        for t in (0, 7, 22):
            changed = idx.clone()
            changed[:, t + 1:] = torch.randint(0, 41, changed[:, t + 1:].shape)
            changed[:, t + 1:] = (changed[:, t + 1:] + 1) % 41  # surely different
            out, _ = model(changed)
            assert torch.allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-6)
            assert not torch.allclose(out[:, t + 1:], base[:, t + 1:], atol=1e-4)


@pytest.mark.parametrize("positions,mlp", [("learned", "gelu"), ("rope", "swiglu"), ("sinusoidal", "relu2")])
def test_tiny_model_overfits_one_batch(positions, mlp):
    torch.manual_seed(0)
    model = GPT(_cfg(positions=positions, mlp=mlp, n_embd=64))
    x = torch.randint(0, 41, (4, 24))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for step in range(300):
        _, loss = model(x, y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.1:
            break
    assert first > 3.0  # about ln(41) at init
    assert loss.item() < 0.1


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = GPT(_cfg(vocab_size=65))
    x, y = torch.randint(0, 65, (8, 24)), torch.randint(0, 65, (8, 24))
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(65)) < 0.2


def test_residual_projections_are_depth_scaled_or_zero():
    torch.manual_seed(0)
    model = GPT(_cfg(n_layer=8, n_embd=128))
    std = model.blocks[0].mlp.c_proj.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(16)) < 0.001
    assert abs(model.blocks[0].attn.c_attn.weight.std().item() - 0.02) < 0.002
    zero = GPT(_cfg(zero_init_proj=True))
    assert zero.blocks[1].attn.c_proj.weight.abs().sum() == 0


def test_tied_and_untied_heads():
    tied, untied = GPT(_cfg(tie_embeddings=True)), GPT(_cfg(tie_embeddings=False))
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() - tied.num_params() == 41 * 32


def test_ignore_index_targets_are_skipped():
    torch.manual_seed(0)
    model = GPT(_cfg())
    x = torch.randint(0, 41, (2, 24))
    y = x.clone()
    y[:, 12:] = -1
    _, partial = model(x, y)
    _, first_half = model(x[:, :12].contiguous(), y[:, :12].contiguous())  # causal: the first 12 positions see the same context either way
    _, whole = model(x, x)
    assert torch.allclose(partial, first_half, atol=1e-6)
    assert not torch.allclose(partial, whole)  # the ignored half really was left out


def test_gpt2_124m_parameter_count_and_flops():
    cfg = ModelConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    with torch.device("meta"):
        model = GPT(cfg)
    # the published GPT-2 small count: 124,439,808 parameters with the tied head (nanoGPT reports 124.44M)
    assert model.num_params() == 124_439_808
    n = model.num_params(non_embedding=True) + 50257 * 768
    assert model.flops_per_token() == 6 * n + 12 * 12 * 1024 * 768


def test_flops_count_the_head_once_tied_or_untied():
    """A separate head matrix does the same multiply-adds as a tied one: MFU must not depend on tying."""
    tied, untied = GPT(_cfg(tie_embeddings=True)), GPT(_cfg(tie_embeddings=False))
    assert untied.flops_per_token() == tied.flops_per_token()
    V, T, L, C = 41, 24, 2, 32  # counted by hand: per block QKV 3C^2+3C, W_O C^2+C, MLP 8C^2+5C, two norms 4C
    per_block = 12 * C * C + 13 * C
    assert tied.flops_per_token() == 6 * (L * per_block + 2 * C + V * C) + 12 * L * T * C == 179_136


def test_too_long_input_is_refused():
    model = GPT(_cfg())
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 25, dtype=torch.long))


def test_gelu_variants_are_the_tanh_and_erf_forms():
    from model.layers import MLP

    torch.manual_seed(0)
    x = torch.randn(4, 32) * 3
    tanh, exact = MLP(_cfg(mlp="gelu")), MLP(_cfg(mlp="gelu_exact"))
    exact.load_state_dict(tanh.state_dict())
    h = tanh.c_fc(x)
    assert torch.allclose(tanh(x), tanh.c_proj(torch.nn.functional.gelu(h, approximate="tanh")))
    assert torch.allclose(exact(x), exact.c_proj(torch.nn.functional.gelu(h)))
    assert not torch.allclose(tanh(x), exact(x))
