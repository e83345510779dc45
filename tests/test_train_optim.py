"""train.optim: parameter groups, the combined Muon + AdamW optimizer, and the LR schedule."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from model.config import ModelConfig
from model.gpt import GPT
from train.config import TrainConfig
from train.optim import CombinedOptimizer, build_optimizer, lr_factor, param_groups, set_lr


def _two() -> tuple[CombinedOptimizer, torch.nn.Parameter, torch.nn.Parameter]:
    a, b = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4))
    return CombinedOptimizer([torch.optim.SGD([a], lr=0.1), torch.optim.AdamW([b], lr=0.1)]), a, b


def test_combined_optimizer_runs_step_hooks():
    opt, a, b = _two()
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    (a.sum() + b.sum()).backward()
    before = a.detach().clone()
    opt.step()
    assert calls == ["pre", "post"]
    assert not torch.equal(a, before)


def test_torch_lr_scheduler_drives_every_inner_optimizer():
    opt, a, b = _two()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.5 ** epoch)
    for _ in range(2):
        (a.sum() + b.sum()).backward()
        opt.step()
        sched.step()
    assert [g["lr"] for inner in opt.optimizers for g in inner.param_groups] == [0.025, 0.025]


def test_combined_state_round_trips():
    opt, a, b = _two()
    (a.sum() + b.sum()).backward()
    opt.step()
    fresh = CombinedOptimizer([torch.optim.SGD([a], lr=0.1), torch.optim.AdamW([b], lr=0.1)])
    fresh.load_state_dict(opt.state_dict())
    assert torch.equal(fresh.optimizers[1].state[b]["exp_avg"], opt.optimizers[1].state[b]["exp_avg"])


def test_param_groups_put_each_tensor_in_one_group_once():
    model = GPT(ModelConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=16))
    groups = param_groups(model)
    ids = [id(p) for g in groups.values() for p in g]
    assert len(ids) == len(set(ids)) == len({id(p) for p in model.parameters()})
    assert model.wte.weight in groups["embed"] and all(p.ndim == 1 for p in groups["vector"])


def test_muon_optimizer_covers_hidden_matrices_only():
    model = GPT(ModelConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=16))
    opt = build_optimizer(model, TrainConfig(optimizer="muon"), "cpu")
    muon, adam = opt.optimizers
    assert all(p.ndim == 2 for g in muon.param_groups for p in g["params"])
    assert model.wte.weight in [p for g in adam.param_groups for p in g["params"]]
    assert set_lr(opt, 0.5) == pytest.approx(adam.param_groups[-1]["base_lr"] * 0.5)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=10, schedule="cosine")
    assert lr_factor(0, 0.0, cfg) == pytest.approx(0.1)
    assert lr_factor(9, 0.0, cfg) == pytest.approx(1.0)
    assert lr_factor(500, 0.5, cfg) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(1000, 1.0, cfg) == pytest.approx(0.1)


def test_wsd_schedule_holds_then_decays_linearly():
    cfg = TrainConfig(lr=1.0, min_lr=0.0, warmup_iters=0, schedule="wsd", decay_fraction=0.2)
    assert lr_factor(0, 0.5, cfg) == 1.0 and lr_factor(0, 0.8, cfg) == 1.0
    assert lr_factor(0, 0.9, cfg) == pytest.approx(0.5)
    assert math.isclose(lr_factor(0, 1.0, cfg), 0.0, abs_tol=1e-12)


def _tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=16))


def _loss(model: GPT) -> torch.Tensor:
    idx = torch.arange(32).view(2, 16) % 37
    return model(idx, idx)[1]


def test_combined_optimizer_zero_grad_and_closure_reach_every_inner_optimizer():
    opt, a, b = _two()
    (a.sum() + b.sum()).backward()
    opt.zero_grad()
    assert a.grad is None and b.grad is None
    before = (a.detach().clone(), b.detach().clone())

    def closure():
        loss = a.square().sum() + b.square().sum()
        loss.backward()
        return loss

    assert opt.step(closure) is not None
    assert not torch.equal(a, before[0]) and not torch.equal(b, before[1])


def test_resuming_the_muon_and_adamw_pair_from_its_state_takes_the_same_next_step():
    model = _tiny()
    opt = build_optimizer(model, TrainConfig(optimizer="muon", lr=1e-2, muon_lr=2e-2), "cpu")
    for _ in range(2):
        opt.zero_grad()
        _loss(model).backward()
        opt.step()
    twin = _tiny()
    twin.load_state_dict(model.state_dict())
    twin_opt = build_optimizer(twin, TrainConfig(optimizer="muon", lr=1e-2, muon_lr=2e-2), "cpu")
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # as saved: state_dict() shares the live tensors
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad()
        _loss(m).backward()
        o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_adamw_decays_matrices_and_embeddings_but_never_vectors():
    model = _tiny()
    opt = build_optimizer(model, TrainConfig(optimizer="adamw", weight_decay=0.1), "cpu")
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert decay[id(p)] == (0.1 if p.ndim >= 2 else 0.0), name


def test_set_lr_scales_each_group_from_its_own_base():
    model = _tiny()
    opt = build_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=2e-2), "cpu")
    logged = set_lr(opt, 0.25)
    muon, adam = opt.optimizers
    assert all(g["lr"] == pytest.approx(2e-2 * 0.25) for g in muon.param_groups)
    assert all(g["lr"] == pytest.approx(1e-3 * 0.25) for g in adam.param_groups) and logged == pytest.approx(2.5e-4)


def test_lr_schedule_is_clamped_monotone_after_warmup_and_handles_lr_zero():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=0, schedule="cosine")
    assert lr_factor(0, -0.5, cfg) == pytest.approx(1.0) and lr_factor(0, 7.0, cfg) == pytest.approx(0.1)
    curve = [lr_factor(0, p / 20, cfg) for p in range(21)]
    assert all(x >= y for x, y in zip(curve, curve[1:])) and curve[0] > curve[-1]
    assert lr_factor(0, 1.0, TrainConfig(lr=0.0, min_lr=0.0, warmup_iters=0)) == pytest.approx(0.0)
    wsd = TrainConfig(lr=1.0, min_lr=0.5, warmup_iters=4, schedule="wsd", decay_fraction=0.5)
    assert lr_factor(1, 0.0, wsd) == pytest.approx(0.5)  # warmup multiplies whatever phase it meets
    assert lr_factor(100, 1.0, wsd) == pytest.approx(0.5)  # the floor is min_lr / lr
