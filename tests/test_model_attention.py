"""The attention formula against DESIGN.md's worked numbers, and the fused path against the explicit one."""
import itertools

import pytest
import torch

from model.attention import (additive_attention, causal_mask, fused_attention, scaled_dot_product_attention)
from model.config import ModelConfig
from model.gpt import GPT

Q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
K = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
V = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])


def test_worked_example_weights_and_outputs():
    out, attn = scaled_dot_product_attention(Q, K, V)
    expected_w = torch.tensor([[0.401, 0.198, 0.401], [0.248, 0.504, 0.248], [1 / 3, 1 / 3, 1 / 3]])
    expected_out = torch.tensor([[6.02, 3.98], [3.72, 6.28], [5.00, 5.00]])
    assert torch.allclose(attn, expected_w, atol=0.01)
    assert torch.allclose(out, expected_out, atol=0.01)


def test_worked_example_with_leading_dims_and_mask():
    q, k, v = (t.expand(2, 3, 3, 2) for t in (Q, K, V))
    out, attn = scaled_dot_product_attention(q, k, v, causal_mask(3))
    assert out.shape == (2, 3, 3, 2) and attn.shape == (2, 3, 3, 3)
    assert torch.equal(attn[..., 0, 1:], torch.zeros(2, 3, 2))  # first query sees only itself
    assert torch.allclose(attn[0, 0, 0, 0], torch.tensor(1.0))
    assert torch.allclose(out[1, 2, 2], torch.tensor([5.0, 5.0]), atol=0.01)  # last row is unmasked


def test_unscaled_scores_saturate_softmax():
    # DESIGN.md's numbers, through the project's attention: raw scores (16, 4, 0.8) and (2.0, 0.5, 0.1)
    q, k = torch.tensor([[4.0, 4.0, 4.0, 4.0]]), torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.25] * 4, [0.05] * 4])
    _, w_unscaled = scaled_dot_product_attention(q, k, k, scaled=False)
    assert w_unscaled[0, 0] > 0.9999 and w_unscaled[0, 1] < 1e-4 and w_unscaled[0, 2] < 1e-4
    _, w_small = scaled_dot_product_attention(q, k / 8, k, scaled=False)
    assert torch.allclose(w_small[0], torch.tensor([0.73, 0.16, 0.11]), atol=0.01)
    # the scale option: dividing by sqrt(d_k) keeps the same scores far from one-hot
    _, w_scaled = scaled_dot_product_attention(q, k, k, scaled=True)
    assert w_scaled.max() < 0.999


def test_random_scores_of_variance_dk_saturate_without_scale():
    torch.manual_seed(0)
    d_k = 256
    q, k = torch.randn(64, 8, d_k), torch.randn(64, 8, d_k)
    _, unscaled = scaled_dot_product_attention(q, k, k, scaled=False)
    _, scaled = scaled_dot_product_attention(q, k, k, scaled=True)
    assert unscaled.max(-1).values.mean() > 0.9 > scaled.max(-1).values.mean()


def test_rows_sum_to_one_and_future_is_exactly_zero():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 7, 4), torch.randn(3, 2, 7, 4), torch.randn(3, 2, 7, 4)
    for fn in (lambda m: scaled_dot_product_attention(q, k, v, m),
               lambda m: additive_attention(q, k, v, torch.randn(4, 5), torch.randn(4, 5), torch.randn(5), m)):
        _, attn = fn(causal_mask(7))
        assert torch.allclose(attn.sum(-1), torch.ones(3, 2, 7), atol=1e-6)
        upper = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)
        assert torch.equal(attn[..., upper], torch.zeros_like(attn[..., upper]))


def test_additive_scorer_matches_its_definition():
    torch.manual_seed(1)
    q, k, v = torch.randn(4, 3), torch.randn(5, 3), torch.randn(5, 2)
    wq, wk, vv = torch.randn(3, 6), torch.randn(3, 6), torch.randn(6)
    out, attn = additive_attention(q, k, v, wq, wk, vv)
    scores = torch.stack([torch.stack([vv @ torch.tanh(wq.T @ q[i] + wk.T @ k[j]) for j in range(5)]) for i in range(4)])
    assert torch.allclose(attn, torch.softmax(scores, -1), atol=1e-6)
    assert torch.allclose(out, attn @ v, atol=1e-6)


@pytest.mark.parametrize("masked,scaled", list(itertools.product([False, True], [False, True])))
def test_fused_function_agrees_with_explicit(masked, scaled):
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    ref, _ = scaled_dot_product_attention(q, k, v, causal_mask(9) if masked else None, scaled=scaled)
    fused = fused_attention(q, k, v, causal=masked, scaled=scaled)
    assert torch.allclose(fused, ref, rtol=1e-5, atol=1e-6)


def _cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=37, block_size=16, n_layer=2, n_head=4, n_embd=32)
    base.update(kw)
    return ModelConfig(**base)


OPTIONS = list(itertools.product(["learned", "rope", "sinusoidal"], [0, 2, 1], [False, True], [False, True],
                                 ["gelu", "swiglu", "relu2"]))


@pytest.mark.parametrize("positions,n_kv_head,qk_norm,scaled,mlp", OPTIONS)
def test_model_fused_and_explicit_paths_agree(positions, n_kv_head, qk_norm, scaled, mlp):
    torch.manual_seed(3)
    cfg = _cfg(positions=positions, n_kv_head=n_kv_head, qk_norm=qk_norm, scaled=scaled, mlp=mlp)
    fused = GPT(cfg).eval()
    manual = GPT(_cfg(positions=positions, n_kv_head=n_kv_head, qk_norm=qk_norm, scaled=scaled, mlp=mlp,
                      attention="manual")).eval()
    manual.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        a, _ = fused(idx)
        b, _ = manual(idx)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_multi_head_has_parameter_count_of_single_head():
    from model.attention import CausalSelfAttention
    counts = {h: sum(p.numel() for p in CausalSelfAttention(_cfg(n_embd=64, n_head=h)).parameters()) for h in (1, 2, 8)}
    assert counts[1] == counts[2] == counts[8] == 4 * 64 * 64 + 4 * 64


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_gqa_equals_multi_head_with_each_kv_head_copied_to_its_query_group(attention):
    """2 KV heads for 4 query heads is plain 4-head attention whose K/V heads 0,1 and 2,3 are copies of each other."""
    torch.manual_seed(4)
    gqa, plain = GPT(_cfg(n_kv_head=2, attention=attention)).eval(), GPT(_cfg(attention=attention)).eval()
    state = gqa.state_dict()
    C, d = 32, 8
    for name, value in list(state.items()):
        if ".c_attn." in name:
            q, k, v = value.split([C, 2 * d, 2 * d])
            widen = lambda t: t.reshape(2, d, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(4 * d, *t.shape[1:])
            state[name] = torch.cat([q, widen(k), widen(v)])
    plain.load_state_dict(state)
    idx = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        assert torch.allclose(plain(idx)[0], gqa(idx)[0], atol=1e-6)
        assert not torch.allclose(GPT(_cfg(n_kv_head=2, attention=attention)).eval()(idx)[0], gqa(idx)[0])


def test_multi_query_shares_one_key_value_head():
    full, mqa = GPT(_cfg()), GPT(_cfg(n_kv_head=1))
    head_dim = 8
    assert full.blocks[0].attn.c_attn.weight.shape[0] == 3 * 32
    assert mqa.blocks[0].attn.c_attn.weight.shape[0] == 32 + 2 * head_dim


@pytest.mark.parametrize("norm,bias,tie,softcap", list(itertools.product(["layernorm", "rmsnorm"], [True, False],
                                                                          [True, False], [0.0, 15.0])))
def test_model_paths_agree_across_norm_bias_head_options(norm, bias, tie, softcap):
    torch.manual_seed(5)
    kw = dict(norm=norm, bias=bias, tie_embeddings=tie, logit_softcap=softcap, dropout=0.1)
    fused, manual = GPT(_cfg(**kw)).eval(), GPT(_cfg(attention="manual", **kw)).eval()
    manual.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 37, (3, 11))
    with torch.no_grad():
        assert torch.allclose(fused(idx)[0], manual(idx)[0], rtol=1e-5, atol=1e-5)
