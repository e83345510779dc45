"""The trainer's GPU-path choices, tested on CPU by faking the condition: RNG state of the run's own GPU only, the
loader on the run's device, no host read of the device outside settle steps, no logits asked of the training
forward, dtype re-picked on another kind of device, rank 0's failures reaching every rank."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.checkpoint import load_trainer_state
from model.gpt import GPT
from train import trainer as loop
from train.loop import train
from train.rng import rng_state, set_rng_state

ROOT = Path(__file__).resolve().parents[1]
LOOP_FILES = {str(ROOT / "train" / f) for f in ("loop.py", "trainer.py", "collectives.py", "state.py", "rng.py")}


def test_rng_state_holds_and_restores_only_the_runs_own_gpu(monkeypatch):
    """Saved on cuda:1 of a 4-GPU node, resumed on a machine that shows one GPU: no set_rng_state_all."""
    tags = {i: torch.full((8,), i, dtype=torch.uint8) for i in range(4)}
    restored: list = []

    def everything(*args):
        raise AssertionError("touched every visible GPU's generator")

    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": tags[torch.device(device).index])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append((state, device)))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", everything)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", everything)
    state = rng_state(torch.device("cuda", 1))
    assert torch.equal(state["cuda"], tags[1]) and torch.equal(state["cpu"], torch.get_rng_state())
    set_rng_state(state, torch.device("cuda", 0))
    assert len(restored) == 1 and torch.equal(restored[0][0], tags[1]) and restored[0][1] == torch.device("cuda", 0)
    old = {"cpu": torch.get_rng_state(), "cuda": [tags[0], tags[1]]}  # older checkpoints: one state per GPU
    set_rng_state(old, torch.device("cuda", 1))
    assert torch.equal(restored[-1][0], tags[1])
    set_rng_state(old, torch.device("cuda", 3))  # that GPU's state was never saved: the CPU's only
    set_rng_state(old, torch.device("cpu"))
    assert len(restored) == 2
    assert "cuda" not in rng_state(torch.device("cpu"))


def test_the_trainer_builds_its_loader_on_its_device_and_prefetches(tiny_config, monkeypatch):
    made: list[dict] = []
    fetched: list[tuple] = []

    class Spy(loop.ShardLoader):
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            super().__init__(*args, **kwargs)

        def get_batch(self, step, micro_step=0):
            fetched.append((step, micro_step))
            return super().get_batch(step, micro_step)

    monkeypatch.setattr(loop, "ShardLoader", Spy)
    tiny_config.train.max_iters, tiny_config.train.grad_accum = 3, 2
    train(tiny_config)
    assert made and made[0]["device"] == torch.device("cpu")  # the runtime's device, not the loader's default
    assert fetched == [(s, m) for s in range(4) for m in range(2)][:7]  # in order, one micro-batch ahead


def test_a_step_reads_the_device_only_when_it_logs_evaluates_or_stops(tiny_config, monkeypatch):
    """A host read (item, tolist, float, bool) waits for the GPU: the loop may do one per settle step only."""
    reads: list[str] = []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name):
            if sys._getframe(1).f_code.co_filename in LOOP_FILES:
                reads.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    tiny_config.train.max_iters, tiny_config.train.log_interval, tiny_config.train.eval_interval = 20, 5, 20
    train(tiny_config)
    assert reads == ["tolist"] * 5  # steps 1, 5, 10, 15, 20 (the last also evaluates); none on the other 15


def test_the_training_forward_never_asks_for_logits(tiny_config, monkeypatch):
    asked: list = []
    original = GPT.forward

    def spy(self, idx, targets=None, **kwargs):
        if self.training and targets is not None:
            asked.append(kwargs.get("return_logits", True))
        return original(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", spy)
    tiny_config.train.max_iters = 4
    train(tiny_config)
    assert asked == [False] * 4


def test_a_run_moved_to_another_kind_of_device_repicks_its_dtype(tiny_config, capsys):
    """Started in bf16 on a GPU (faked by the saved state's device kind), resumed on CPU: auto picks afresh."""
    tiny_config.train.dtype, tiny_config.train.stop_at = "bfloat16", 10
    train(tiny_config)
    path = Path(tiny_config.train.out_dir) / "latest" / "trainer_state.pt"
    state = load_trainer_state(path.parent)
    assert state["device_type"] == "cpu" and state["dtype"] == "bfloat16"
    state["device_type"] = "cuda"
    torch.save(state, path)
    tiny_config.train.dtype, tiny_config.train.stop_at, tiny_config.train.resume = "auto", 0, "auto"
    capsys.readouterr()
    train(tiny_config)
    assert "resuming at step 10" in capsys.readouterr().err
    after = load_trainer_state(path.parent)
    assert after["dtype"] == "float32" and after["device_type"] == "cpu"  # a 32-wide model: auto is fp32 on CPU


@pytest.mark.distributed
def test_a_failure_in_rank_0s_evaluation_stops_every_rank_at_once(tiny_config, tmp_path):
    """Rank 1 waits for rank 0 after each evaluation; under the 1-hour timeout it must not wait for a dead one."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "tests/ddp_eval_failure.py", "--config", "configs/tiny.toml", "--data.source", "files",
           "--data.path", tiny_config.data.path, "--data.dir", tiny_config.data.dir,
           "--train.out_dir", str(tmp_path / "run"), "--log.attention", "false", "--log.sample_tokens", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("a rank was left waiting for rank 0")
    assert proc.returncode != 0
    assert "error: disk full (simulated at rank 0's evaluation)" in err  # rank 0: its own error, one line
    assert "error: rank 0 failed while evaluating at step 10: OSError: disk full" in err  # rank 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 10  # nobody trained on past the failed evaluation
