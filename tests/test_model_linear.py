"""model.linear: inference products on CPU through oneDNN, the same numbers as F.linear; training untouched."""
from __future__ import annotations

import gc
import warnings

import pytest
import torch
import torch.nn.functional as F

from model.linear import Linear, onednn_applies, use_onednn

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return Linear(48, 80)


@needs_onednn
@pytest.mark.parametrize("shape", [(8, 1, 48), (3, 7, 48), (5, 48)])
def test_inference_goes_through_onednn_and_matches_f_linear(layer, shape):
    x = torch.randn(*shape)
    with torch.inference_mode():
        assert onednn_applies(x, layer.weight)
        y = layer(x)
    assert y.shape == (*shape[:-1], 80)
    torch.testing.assert_close(y, F.linear(x, layer.weight.detach(), layer.bias.detach()), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # no_grad too: evaluation and the cached-vs-full checks run there
        assert onednn_applies(x, layer.weight)
        sliced = layer(torch.randn(2, 9, 48)[:, -3:])  # a non-contiguous view, as logits_to_keep makes
    assert sliced.shape == (2, 3, 80)


@needs_onednn
def test_batched_decoding_reads_a_packed_copy_that_follows_the_weight():
    import model.linear as ml

    layer = Linear(48, 80)  # its own, not the fixture's: pytest holds fixtures until the test ends
    x = torch.randn(8, 1, 48)  # eight sequences, one new token each
    with torch.inference_mode():
        assert onednn_applies(torch.randn(1, 1, 48), layer.weight)  # batch-1 decoding too, on the plain weights
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        packed = ml._packed[id(layer.weight)][2]
        assert packed.is_mkldnn
        layer(x)
        assert ml._packed[id(layer.weight)][2] is packed  # made once, reused
        layer(torch.randn(1, 5, 48))  # a prefill takes the plain weights: nothing new is packed
        assert ml._packed[id(layer.weight)][2] is packed
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # an in-place change (load_state_dict, an optimizer step) bumps the version
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert ml._packed[id(layer.weight)][2] is not packed
    key = id(layer.weight)
    del layer, packed
    gc.collect()
    assert key not in ml._packed  # the copy goes with its weight


def test_training_keeps_f_linear_and_its_gradients(layer):
    x = torch.randn(4, 48, requires_grad=True)
    assert not onednn_applies(x, layer.weight)
    layer(x).square().sum().backward()
    assert layer.weight.grad is not None and x.grad is not None and layer.weight.grad.abs().sum() > 0


def test_autocast_quantized_or_switched_off_fall_back(layer):
    x = torch.randn(2, 48)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_applies(x, layer.weight)
        assert layer(x).dtype == torch.bfloat16  # autocast still applies, as it does to nn.Linear
    with torch.no_grad():
        assert not onednn_applies(x.double(), layer.weight.double())
        previous = use_onednn(False)
        try:
            assert not onednn_applies(x, layer.weight)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        finally:
            use_onednn(previous)


@needs_onednn
def test_prepack_makes_the_batched_copies_up_front():
    import model.linear as ml
    from model.config import ModelConfig
    from model.gpt import GPT

    gpt = GPT(ModelConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
    linears = [m for m in gpt.modules() if isinstance(m, Linear)]
    assert ml.prepack(gpt) == len(linears) == 2 * 4 + 1  # per block c_attn, c_proj, c_fc, c_proj; the head
    packed = {id(m.weight): ml._packed[id(m.weight)][2] for m in linears}
    with torch.inference_mode():
        logits, _ = gpt(torch.zeros(3, 1, dtype=torch.long))  # three sequences, one token each
    assert logits.shape == (3, 1, 40)
    assert all(ml._packed[key][2] is p for key, p in packed.items())  # the step used them, made nothing new
    previous = use_onednn(False)
    try:
        assert ml.prepack(gpt) == 0
    finally:
        use_onednn(previous)


@needs_onednn
def test_weights_made_under_inference_mode_pack_too():
    with torch.inference_mode():
        layer = Linear(48, 80)  # e.g. a model loaded inside inference_mode: its tensors keep no version counter
        x = torch.randn(4, 1, 48)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_packed_copies_stay_within_their_budget_and_the_rest_reads_the_plain_weights(monkeypatch):
    import model.linear as ml

    torch.manual_seed(0)
    small, large = Linear(48, 80), Linear(80, 800)
    held = sum(e[2].numel() * e[2].element_size() for e in ml._packed.values())  # other tests' live copies
    monkeypatch.setattr(ml, "_budget", held + small.weight.numel() * 4 + 100)  # room for the small one only
    monkeypatch.setattr(ml, "_warned", False)
    model = torch.nn.Sequential(small, large)
    with pytest.warns(UserWarning, match="not packing more weights"):
        assert ml.prepack(model) == 1
    assert id(small.weight) in ml._packed and id(large.weight) not in ml._packed
    x = torch.randn(8, 1, 48)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, at prepack: the batched step says nothing new
        torch.testing.assert_close(model(x), F.linear(F.linear(x, small.weight, small.bias), large.weight,
                                                      large.bias), rtol=1e-5, atol=1e-5)
    assert id(large.weight) not in ml._packed and id(large.weight) in ml._refused
    weighed = []
    monkeypatch.setattr(ml, "pack_budget", lambda: weighed.append(1) or ml._budget)
    with torch.inference_mode():
        model(x)
        assert weighed == []  # a refused weight is not weighed again at every step...
    with torch.no_grad():
        large.weight.mul_(1.0)
    with torch.inference_mode():
        model(x)
    assert weighed == [1]  # ...until it changes
    key = id(large.weight)
    del model, large
    gc.collect()
    assert key not in ml._refused  # forgotten with its weight


def test_the_budget_is_half_the_memory_available_at_the_first_packing(monkeypatch):
    import model.linear as ml

    assert 0 < ml.available_memory() < 2**50
    monkeypatch.setattr(ml, "_budget", None)
    monkeypatch.setattr(ml, "available_memory", lambda: 10 * 2**30)
    assert ml.pack_budget() == 5 * 2**30
    monkeypatch.setattr(ml, "available_memory", lambda: 2**30)
    assert ml.pack_budget() == 5 * 2**30  # fixed once: copies already made are not thrown out later
