"""train.state: what trainer_state.pt holds, read back from older or foreign files, and restored in place."""
from __future__ import annotations

import math

import pytest
import torch

from model.checkpoint import load_trainer_state, save_checkpoint
from train.runtime import Runtime
from train.state import TrainerState


def _optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_new_state_starts_at_zero_with_its_own_run_id():
    a, b = TrainerState(), TrainerState()
    assert (a.step, a.elapsed, a.tokens, a.best_val) == (0, 0.0, 0, math.inf)
    assert a.run_id != b.run_id and len(a.run_id) == 12


def test_snapshot_then_restore_gives_back_optimizer_scaler_and_rng():
    model, optimizer = _optimizer()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    state = TrainerState(step=7, elapsed=1.5, tokens=700, best_val=2.5)
    saved = state.snapshot(optimizer, scaler, torch.device("cpu"), torch.bfloat16, rng_ranks=None)
    assert saved["dtype"] == "bfloat16" and saved["device_type"] == "cpu" and saved["step"] == 7
    assert state.optimizer is None  # a snapshot leaves the live state alone
    expected_draw = torch.rand(3)  # what the saved RNG stream draws next
    _, fresh = _optimizer()
    back = TrainerState.from_dict(saved)
    back.restore(model, fresh, scaler, Runtime(torch.device("cpu"), torch.float32), directory=None)
    assert torch.equal(torch.rand(3), expected_draw)
    for a, b in zip(optimizer.state.values(), fresh.state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_from_dict_ignores_unknown_keys_and_refuses_a_file_without_progress():
    saved = TrainerState(step=3).to_dict() | {"from_a_later_version": 1}
    saved.pop("wandb_id")  # older checkpoints had none
    back = TrainerState.from_dict(saved)
    assert back.step == 3 and back.wandb_id is None
    with pytest.raises(ValueError, match="trainer state lacks step, run_id"):
        TrainerState.from_dict({"elapsed": 0.0, "tokens": 0, "best_val": 1.0})


def test_load_reads_what_a_checkpoint_saved(tmp_path):
    from data.tokenizers import CharTokenizer
    from model.config import ModelConfig
    from model.gpt import GPT

    model = GPT(ModelConfig(vocab_size=8, block_size=8, n_layer=1, n_head=1, n_embd=8))
    state = TrainerState(step=5, tokens=40, best_val=1.25)
    _, optimizer = _optimizer()
    saved = state.snapshot(optimizer, torch.amp.GradScaler("cpu", enabled=False), torch.device("cpu"),
                           torch.float32, None)
    save_checkpoint(tmp_path / "latest", model, CharTokenizer("abcdefgh"), {"model": {}}, saved)
    back = TrainerState.load(tmp_path / "latest")
    assert (back.step, back.tokens, back.best_val, back.run_id) == (5, 40, 1.25, state.run_id)
    assert back.optimizer["state"].keys() == load_trainer_state(tmp_path / "latest")["optimizer"]["state"].keys()
