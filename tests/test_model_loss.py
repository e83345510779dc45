"""The chunked fused LM-head loss gives the loss and gradients of the plain logits path."""
import pytest
import torch
import torch.nn.functional as F

from model.loss import chunked_cross_entropy


@pytest.mark.parametrize("softcap,chunk", [(0.0, 7), (0.0, 1000), (15.0, 5)])
def test_chunked_loss_and_gradients_match_plain_path(softcap, chunk):
    torch.manual_seed(0)
    x = torch.randn(3, 11, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (3, 11))
    t[0, :4] = -1
    z = x @ w.t()
    logits = softcap * torch.tanh(z / softcap) if softcap else z
    ref = F.cross_entropy(logits.view(-1, 50), t.view(-1), ignore_index=-1)
    gx_ref, gw_ref = torch.autograd.grad(ref * 2.5, (x, w))
    loss = chunked_cross_entropy(x, w, t, chunk=chunk, softcap=softcap)
    gx, gw = torch.autograd.grad(loss * 2.5, (x, w))
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(gx, gx_ref, atol=1e-5)
    assert torch.allclose(gw, gw_ref, atol=1e-5)


def test_model_training_path_matches_logits_path():
    from model.config import ModelConfig
    from model.gpt import GPT

    torch.manual_seed(0)
    a = GPT(ModelConfig(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=32, tie_embeddings=True))
    b = GPT(a.config)
    b.load_state_dict(a.state_dict())
    x, y = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    logits, la = a(x, y)
    none, lb = b(x, y, return_logits=False)
    assert none is None and torch.allclose(la, lb, atol=1e-6)
    la.backward()
    lb.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5), name


def test_bf16_autocast_training_path_stays_close_to_fp32():
    """The CPU default for wide models on AMX machines: loss and gradients within bf16 rounding of fp32."""
    from model.config import ModelConfig
    from model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=500, block_size=32, n_layer=2, n_head=4, n_embd=256))
    x = torch.randint(0, 500, (4, 32))

    def run(bf16: bool):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(x, x, return_logits=False)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    (l32, g32), (l16, g16) = run(False), run(True)
    assert l16.dtype == torch.float32 and abs(l16.item() - l32.item()) < 1e-2
    for name, grad in g32.items():
        assert g16[name].dtype == torch.float32
        assert ((g16[name] - grad).norm() / grad.norm()).item() < 0.03, name


def test_the_chunked_loss_is_the_training_path_on_cpu_only():
    from model.loss import chunked_loss_pays

    assert chunked_loss_pays(torch.zeros(2, 3))
    assert not chunked_loss_pays(torch.zeros(2, 3, device="meta"))  # any other device: full logits


def test_the_full_logits_training_path_returns_no_logits_and_matches_the_chunked_one(monkeypatch):
    """What CUDA runs (full logits + fused cross-entropy), forced on CPU: same loss and gradients, no logits."""
    import model.gpt as gpt
    from model.config import ModelConfig

    torch.manual_seed(0)
    a = gpt.GPT(ModelConfig(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=32, logit_softcap=10.0))
    b = gpt.GPT(a.config)
    b.load_state_dict(a.state_dict())
    x, y = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    y[0, :3] = -1
    _, chunked = a(x, y, return_logits=False)
    monkeypatch.setattr(gpt, "chunked_loss_pays", lambda hidden: False)
    none, full = b(x, y, return_logits=False)
    assert none is None and full.grad_fn is not None and "Chunked" not in type(full.grad_fn).__name__
    assert "Chunked" in type(chunked.grad_fn).__name__
    assert torch.allclose(chunked, full, atol=1e-6)
    chunked.backward()
    full.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-5), name
