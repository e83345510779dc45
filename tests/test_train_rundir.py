"""train.rundir: one live run per out_dir (a live holder refuses, a killed one never blocks), resume and clearing."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model.checkpoint import load_trainer_state
from train.loop import train
from train.rundir import LOCK_FILE, RunLock

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def train_cmd(cfg, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scripts.train", "--config", "configs/tiny.toml", "--data.source", "files",
            "--data.path", cfg.data.path, "--data.dir", cfg.data.dir, "--train.out_dir", cfg.train.out_dir,
            "--log.attention", "false", "--log.sample_tokens", "0", *extra]


def long_run(cfg, launcher: list[str] | None = None) -> subprocess.Popen:
    """A run that keeps training (and checkpointing every 10 steps) until the test stops it."""
    cmd = train_cmd(cfg, "--train.max_iters", "1000000", "--train.max_seconds", "600")
    if launcher:
        cmd = [*launcher, *cmd[1:]]
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for(predicate, proc: subprocess.Popen, what: str, seconds: float = 180.0) -> None:
    deadline = time.time() + seconds
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the first run ended before {what}: {proc.stderr.read()[-2000:]}")
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def lock_holder(out: Path) -> dict:
    try:
        return json.loads((out / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    proc.communicate(timeout=120)


def test_lock_is_exclusive_and_released(tmp_path):
    with RunLock(tmp_path):
        holder = lock_holder(tmp_path)
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(ValueError, match=f"in use by a live run \\(pid {os.getpid()} on host"):
            RunLock(tmp_path).acquire()
    RunLock(tmp_path).acquire().release()  # free again once released


@pytest.mark.slow
def test_a_live_run_refuses_a_second_one_whatever_its_options(tiny_config):
    out = Path(tiny_config.train.out_dir)
    first = long_run(tiny_config)
    try:
        wait_for(lambda: (out / "latest").exists() and lock_holder(out).get("pid") == first.pid, first,
                 "the first checkpoint")
        for extra in ([], ["--train.resume", "auto"], ["--train.overwrite", "true"]):
            second = subprocess.run(train_cmd(tiny_config, *extra), cwd=ROOT, env=ENV, capture_output=True,
                                    text=True, timeout=120)
            err = second.stderr.strip()
            assert second.returncode == 2, err[-2000:]
            assert len(err.splitlines()) == 1, err
            assert f"pid {first.pid} on host {socket.gethostname()}" in err, err
        assert first.poll() is None  # the first run trains on, untouched
        steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert steps == sorted(steps)  # one writer: no interleaved rows
    finally:
        stop(first)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_never_blocks_its_resume(tiny_config):
    out = Path(tiny_config.train.out_dir)
    first = long_run(tiny_config)
    try:
        wait_for(lambda: (out / "latest" / "trainer_state.pt").exists(), first, "the first checkpoint")
    finally:
        stop(first, signal.SIGKILL)
    assert (out / LOCK_FILE).exists()  # the stale lock file is still there ...
    saved = load_trainer_state(out / "latest")["step"]
    tiny_config.train.resume = "auto"
    tiny_config.train.max_iters = saved + 10
    assert train(tiny_config)["step"] == saved + 10  # ... and does not stand in the way


@pytest.mark.slow
@pytest.mark.distributed
def test_under_torchrun_rank0_holds_the_lock(tiny_config):
    out = Path(tiny_config.train.out_dir)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    first = long_run(tiny_config, launcher=torchrun)
    try:
        wait_for(lambda: (out / "latest").exists() and lock_holder(out).get("pid"), first, "the first checkpoint")
        pid = lock_holder(out)["pid"]
        env = dict(line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in line)
        assert env.get("RANK") == "0" and pid != first.pid  # a worker, rank 0, not the launcher
        second = subprocess.run(train_cmd(tiny_config, "--train.resume", "auto"), cwd=ROOT, env=ENV,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and f"pid {pid} on host" in second.stderr, second.stderr[-2000:]
    finally:
        stop(first)


def test_resume_applies_allowed_changes_and_names_them(tiny_config, capsys):
    tiny_config.train.max_iters = 10
    train(tiny_config)
    capsys.readouterr()
    tiny_config.train.resume = "auto"
    tiny_config.train.max_iters, tiny_config.train.lr, tiny_config.model.dropout = 14, 1e-3, 0.1
    assert train(tiny_config)["step"] == 14
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("resuming with changed settings"))
    for change in ("model.dropout 0.0 -> 0.1", "train.lr 0.003 -> 0.001", "train.max_iters 10 -> 14"):
        assert change in line, line


@pytest.mark.parametrize("section, key, value", [("model", "n_embd", 64), ("train", "batch_size", 4),
                                                 ("data", "tokenizer", "gpt2"), ("train", "optimizer", "muon")])
def test_resume_refuses_a_change_of_model_data_or_optimizer_naming_the_field(tiny_config, section, key, value):
    tiny_config.train.max_iters = 10
    train(tiny_config)
    tiny_config.train.resume = "auto"
    old = getattr(getattr(tiny_config, section), key)
    setattr(getattr(tiny_config, section), key, value)
    with pytest.raises(ValueError, match=f"holds a different run \\({section}.{key} {old!r} -> {value!r}\\)"):
        train(tiny_config)


def test_resume_refuses_other_text_behind_the_same_settings(tiny_config, tmp_path):
    tiny_config.train.max_iters = 10
    train(tiny_config)
    other = tmp_path / "other.txt"
    other.write_text(Path(tiny_config.data.path).read_text()[::-1])  # the same characters, other text
    tiny_config.train.resume, tiny_config.data.path = "auto", str(other)
    with pytest.raises(ValueError, match="holds other text .* than the run being resumed"):
        train(tiny_config)


def test_a_resume_on_another_world_size_keeps_the_micro_batches_per_step(tiny_config, capsys):
    """Saved by 2 processes with grad_accum 2 (4 micro-batches a step): 1 or 4 processes rescale grad_accum, 3
    cannot share 4 and are refused in one line; an explicit grad_accum that keeps the product is accepted."""
    import copy

    from train.rundir import resume_point

    tiny_config.train.grad_accum, tiny_config.train.stop_at = 2, 10
    train(tiny_config)
    out = Path(tiny_config.train.out_dir)
    config_file = out / "latest" / "config.json"
    saved = json.loads(config_file.read_text())
    assert saved["world_size"] == 1
    config_file.write_text(json.dumps({**saved, "world_size": 2}))  # as if two processes had trained it
    tiny_config.train.resume = "auto"
    for world, accum in ((1, 4), (4, 1), (2, 2)):
        cfg = copy.deepcopy(tiny_config)
        assert resume_point(cfg, out, world) == out / "latest" and cfg.train.grad_accum == accum
    assert "train.grad_accum 2 -> 4, so each step still takes 4 micro-batches" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^train.grad_accum: .* = 4 per step, which 3 processes cannot share"):
        resume_point(copy.deepcopy(tiny_config), out, 3)
    explicit = copy.deepcopy(tiny_config)
    explicit.train.grad_accum = 4
    assert resume_point(explicit, out, 1) == out / "latest"
    explicit.train.grad_accum = 3  # another number of micro-batches a step: another run
    with pytest.raises(ValueError, match="holds a different run .*train.grad_accum 2 -> 3"):
        resume_point(explicit, out, 1)
