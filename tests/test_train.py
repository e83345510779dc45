"""Training: the script end to end, exact resume, safe checkpoints, NaN handling, the out_dir guard, signals."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from model.checkpoint import load_checkpoint, load_trainer_state, resolve_checkpoint_dir, save_checkpoint
from model.gpt import GPT
from train.loop import train

ROOT = Path(__file__).resolve().parents[1]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def step_losses(run: Path) -> dict[int, float]:
    return {m["step"]: m["train/loss"] for m in metrics(run) if "train/loss" in m}


def test_train_script_end_to_end(tmp_path, corpus_file):
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "scripts.train", "--config", "configs/tiny.toml",
                          "--data.source", "files", "--data.path", str(corpus_file), "--data.dir", str(tmp_path / "d"),
                          "--train.out_dir", str(run)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = metrics(run)
    evals = [r for r in rows if "val/loss" in r]
    assert [r["step"] for r in evals] == [10, 20]
    assert evals[-1]["val/loss"] < evals[0]["val/loss"] < 4.5
    logged = [r for r in rows if "train/loss" in r]
    assert {"lr", "grad_norm", "tokens/s", "step_time_ms", "mfu", "tokens"} <= set(logged[-1])
    for name in ("latest", "best"):
        for f in ("model.safetensors", "config.json", "tokenizer.json"):
            assert (run / name / f).is_file()
    assert (run / "latest" / "trainer_state.pt").is_file()
    assert "--- step 20 ---" in (run / "samples.txt").read_text()
    assert (run / "attention" / "step_000020" / "attention_grid.png").is_file()
    ck = load_checkpoint(run)
    assert ck.path.name == "best" and ck.config["train"]["max_iters"] == 20


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16 autocast: the default for wide models on AMX CPUs
def test_exact_resume_matches_uninterrupted_run(tiny_config, tmp_path, dtype):
    tiny_config.train.dtype = dtype
    tiny_config.model.dropout = 0.1  # dropout draws from the RNG: resume must restore it
    tiny_config.train.log_interval = 1
    tiny_config.train.eval_interval = 5
    straight = tiny_config
    straight.train.out_dir = str(tmp_path / "straight")
    train(straight)

    straight.train.out_dir = str(tmp_path / "split")
    straight.train.stop_at = 10
    first = train(straight)
    assert first["step"] == 10 and first["stopped"] == "stop_at"
    straight.train.stop_at, straight.train.resume = 0, "auto"
    second = train(straight)
    assert second["step"] == 20

    a, b = step_losses(tmp_path / "straight"), step_losses(tmp_path / "split")
    assert list(a) == list(range(1, 21)) and a == b  # identical, not just close
    wa = load_checkpoint(tmp_path / "straight" / "latest").model.state_dict()
    wb = load_checkpoint(tmp_path / "split" / "latest").model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_checkpoint_round_trip_is_bit_exact(tiny_config, tmp_path, monkeypatch):
    import train.trainer as loop
    from model.checkpoint import model_state

    held = {}
    real_save = loop.save_checkpoint

    def recording_save(directory, model, *args, **kwargs):  # the weights the trainer held at each save
        held[Path(directory).name] = {k: v.clone() for k, v in model_state(model).items()}
        return real_save(directory, model, *args, **kwargs)

    monkeypatch.setattr(loop, "save_checkpoint", recording_save)
    train(tiny_config)
    run = Path(tiny_config.train.out_dir)
    ck = load_checkpoint(run / "latest")
    loaded = model_state(ck.model)
    assert held["latest"].keys() == loaded.keys()
    assert all(torch.equal(held["latest"][k], loaded[k]) for k in loaded)
    state = load_trainer_state(run / "latest")
    assert state["step"] == 20 and "optimizer" in state and "rng" in state
    copy_dir = save_checkpoint(tmp_path / "copy", ck.model, ck.tokenizer, ck.config)
    again = load_checkpoint(copy_dir)
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in ck.model.state_dict().items())
    assert again.model.lm_head.weight is again.model.wte.weight  # tied weights stay tied after loading


def test_interrupted_write_leaves_previous_checkpoint(tiny_config, monkeypatch, tmp_path):
    train(tiny_config)
    latest = Path(tiny_config.train.out_dir) / "latest"
    before = load_checkpoint(latest).model.state_dict()
    ck = load_checkpoint(latest)
    with torch.no_grad():
        ck.model.wte.weight.add_(1.0)

    def crash(directory):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ck.tokenizer, "save", crash)
    with pytest.raises(OSError):
        save_checkpoint(latest, ck.model, ck.tokenizer, ck.config, {"step": 99})
    after = load_checkpoint(latest).model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not [p for p in latest.parent.iterdir() if p.name.startswith(".latest.tmp")]
    # a kill between the two renames of a swap leaves `.latest.old`, which is still found
    os.replace(latest, latest.parent / ".latest.old")
    shutil.rmtree(latest.parent / "best")  # else best/ is found first and .latest.old never looked for
    assert resolve_checkpoint_dir(latest.parent).name == ".latest.old"
    assert load_trainer_state(latest.parent / ".latest.old")["step"] == 20
    # and the next save restores it before swapping: latest/ is back, .latest.old gone, the new weights in place
    ck2 = load_checkpoint(latest.parent / ".latest.old")
    save_checkpoint(latest, ck2.model, ck2.tokenizer, ck2.config, {"step": 21})
    assert latest.is_dir() and not (latest.parent / ".latest.old").exists()
    assert load_trainer_state(latest)["step"] == 21


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tiny_config, monkeypatch):
    tiny_config.train.stop_at = 10
    train(tiny_config)
    latest = Path(tiny_config.train.out_dir) / "latest"
    good = load_checkpoint(latest).model.state_dict()
    original = GPT.forward

    def poisoned(self, idx, targets=None, **kwargs):
        logits, loss = original(self, idx, targets, **kwargs)
        return logits, (loss * float("nan") if loss is not None and self.training else loss)

    monkeypatch.setattr(GPT, "forward", poisoned)
    tiny_config.train.stop_at, tiny_config.train.resume = 0, "auto"
    with pytest.raises(RuntimeError, match="non-finite loss"):
        train(tiny_config)
    kept = load_checkpoint(latest).model.state_dict()
    assert all(torch.equal(good[k], kept[k]) for k in good)
    assert load_trainer_state(latest)["step"] == 10


def test_out_dir_guard(tiny_config):
    tiny_config.train.max_iters = 10
    train(tiny_config)
    with pytest.raises(ValueError, match="already holds a run"):
        train(tiny_config)
    tiny_config.train.resume = "auto"
    tiny_config.model.n_embd = 64
    with pytest.raises(ValueError, match="different run"):
        train(tiny_config)
    tiny_config.train.overwrite = True
    assert train(tiny_config)["step"] == 10
    assert load_checkpoint(tiny_config.train.out_dir).model.config.n_embd == 64


def test_out_dir_guard_from_the_command_line(tiny_config):
    train(tiny_config)
    out = subprocess.run([sys.executable, "-m", "scripts.train", "--config", "configs/tiny.toml",
                          "--data.source", "files", "--data.path", tiny_config.data.path,
                          "--data.dir", tiny_config.data.dir, "--train.out_dir", tiny_config.train.out_dir],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().startswith("error: train.out_dir")
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("optimizer,schedule", [("muon", "wsd"), ("adamw", "cosine")])
def test_optimizers_and_schedules_reduce_loss(tiny_config, optimizer, schedule):
    tiny_config.train.optimizer, tiny_config.train.schedule = optimizer, schedule
    tiny_config.train.max_iters, tiny_config.train.log_interval = 40, 1
    train(tiny_config)
    losses = step_losses(Path(tiny_config.train.out_dir))
    assert sum(list(losses.values())[-5:]) / 5 < losses[1] - 0.5
    lrs = [m["lr"] for m in metrics(Path(tiny_config.train.out_dir)) if "lr" in m]
    assert max(lrs) == pytest.approx(tiny_config.train.lr, rel=0.05)
    assert lrs[-1] == pytest.approx(tiny_config.train.min_lr, rel=0.2)


def test_grad_accumulation_matches_a_big_batch(tiny_config, tmp_path):
    """2 micro-batches of 4 give the first step of one batch of 8 built from the same windows."""
    from data.loader import ShardLoader
    from data.prepare import prepare

    prepare(tiny_config.data)
    loader = ShardLoader(tiny_config.data.dir, "train", 4, 32, seed=1, micro_steps=2)
    torch.manual_seed(0)
    a = GPT(_model_cfg(tiny_config))
    b = GPT(_model_cfg(tiny_config))
    b.load_state_dict(a.state_dict())
    for micro in range(2):
        x, y = loader.get_batch(0, micro)
        (a(x, y)[1] / 2).backward()
    xs, ys = zip(*(loader.get_batch(0, m) for m in range(2)))
    b(torch.cat(xs), torch.cat(ys))[1].backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6), name


def _model_cfg(cfg):
    from data.meta import read_meta

    cfg.model.vocab_size = read_meta(cfg.data.dir)["vocab_size"]
    return cfg.model


def test_sigterm_saves_and_exits_cleanly(tmp_path, corpus_file):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scripts.train", "--config", "configs/tiny.toml",
                             "--data.source", "files", "--data.path", str(corpus_file), "--data.dir", str(tmp_path / "d"),
                             "--train.out_dir", str(run), "--train.max_iters", "100000", "--train.eval_interval",
                             "100000", "--log.sample_tokens", "0", "--log.attention", "false"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    state = load_trainer_state(run / "latest")
    assert state["step"] >= 10
    assert "interrupted" in err


def test_wandb_offline_run_is_written(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    tiny_config.log.wandb = True
    tiny_config.log.attention = True
    tiny_config.log.sample_tokens = 16
    train(tiny_config)
    runs = list(Path(tiny_config.train.out_dir).glob("wandb/offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("run-*.wandb"))
    media = list((runs[0] / "files" / "media").rglob("*"))
    assert any(p.suffix == ".png" for p in media)  # attention grid images
    assert any("head_stats" in p.name for p in media)  # the head-statistics table
    assert any("samples" in p.name for p in media)
    # The record is written by wandb's service process, which may still be flushing after finish() returns
    # (seen on a loaded 2-core CI machine); teardown stops it as a process exit would.
    import wandb

    wandb.teardown()
    record_file = next(runs[0].glob("run-*.wandb"))
    deadline = time.time() + 60
    while b"max_iters" not in record_file.read_bytes() and time.time() < deadline:
        time.sleep(0.5)
    record = record_file.read_bytes()
    assert b"n_embd" in record and b"max_iters" in record  # the resolved config is the run config
    assert b"val/loss" in record and b"attn/max_induction" in record


def test_resume_from_the_command_line_after_a_pause(tmp_path, corpus_file):
    """A fresh process with the same flags continues the run (vocab_size 0 = "from the data" must match)."""
    run = tmp_path / "run"
    base = [sys.executable, "-m", "scripts.train", "--config", "configs/tiny.toml", "--data.source", "files",
            "--data.path", str(corpus_file), "--data.dir", str(tmp_path / "d"), "--train.out_dir", str(run),
            "--log.attention", "false", "--log.sample_tokens", "0"]
    first = subprocess.run([*base, "--train.stop_at", "10"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run([*base, "--train.resume", "auto"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming at step 10" in second.stderr
    assert sorted(step_losses(run)) == [1, 5, 10, 15, 20]


def test_attention_probe_falls_back_when_the_vocabulary_cannot_spell_it(tiny_config, tmp_path):
    corpus = tmp_path / "lower.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    tiny_config.data.path = str(corpus)
    tiny_config.data.dir = str(tmp_path / "lower")
    tiny_config.log.attention = True
    tiny_config.train.max_iters = 10
    train(tiny_config)
    stats = Path(tiny_config.train.out_dir) / "attention" / "step_000010" / "head_stats.json"
    assert stats.is_file()


def test_resume_keeps_the_precision_the_run_started_with(tiny_config, tmp_path, capsys):
    """dtype auto may resolve differently on another machine (AMX or not): a resumed run keeps its saved dtype."""
    tiny_config.train.dtype, tiny_config.train.stop_at = "bfloat16", 10
    train(tiny_config)
    assert load_trainer_state(Path(tiny_config.train.out_dir) / "latest")["dtype"] == "bfloat16"
    tiny_config.train.dtype, tiny_config.train.stop_at, tiny_config.train.resume = "auto", 0, "auto"
    capsys.readouterr()
    train(tiny_config)  # a 32-wide model: auto alone would pick float32
    assert "device cpu bfloat16" in capsys.readouterr().err
    assert load_trainer_state(Path(tiny_config.train.out_dir) / "latest")["dtype"] == "bfloat16"


def test_a_time_budget_drives_the_progress_bar_in_seconds(tiny_config, capsys):
    """With train.max_seconds the bar counts training seconds to the budget, not steps to a far-off max_iters."""
    tiny_config.train.max_iters, tiny_config.train.max_seconds = 100_000, 2.0
    tiny_config.train.eval_interval = 100_000
    summary = train(tiny_config)
    bars = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("train:")]
    assert summary["stopped"] == "max_seconds" and bars
    assert "/2s [" in bars[-1] and "100%" in bars[-1] and "100000" not in bars[-1], bars[-1]
    shown = int(bars[-1].split("step=")[1].split(",")[0])  # the last step whose loss was read (every log_interval)
    assert 0 < shown <= summary["step"] < shown + tiny_config.train.log_interval + 1
