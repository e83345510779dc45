"""`scripts.train` under torchrun with train.parallel ddp or fsdp (gloo on CPU): the same losses either way, the
same with activation checkpointing, and a run that resumes on another number of processes or under the other
parallelism goes on as the uninterrupted run did."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.checkpoint import load_checkpoint, load_trainer_state

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
pytestmark = [pytest.mark.distributed, pytest.mark.slow]
REL = 1e-5  # fsdp against ddp: the same sums in another order


@pytest.fixture(scope="module")
def data(tmp_path_factory, corpus_file) -> dict[str, str]:
    return {"path": str(corpus_file), "dir": str(tmp_path_factory.mktemp("parallel") / "data")}


def train(data: dict, out: Path, nproc: int, *extra: str, accum: int = 2) -> subprocess.CompletedProcess:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    cmd = [sys.executable, *launcher, "-m", "scripts.train", "--config", "configs/tiny.toml",
           "--data.source", "files", "--data.path", data["path"], "--data.dir", data["dir"],
           "--train.out_dir", str(out), "--train.grad_accum", str(accum), "--train.log_interval", "1",
           "--train.eval_interval", "10", "--log.attention", "false", "--log.sample_tokens", "0", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def assert_close(a: dict[int, float], b: dict[int, float], steps: range, rel: float) -> None:
    assert sorted(a) == sorted(b) == list(steps)
    worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
    assert worst <= rel, f"largest relative difference {worst:.2e} > {rel:.0e}"


@pytest.fixture(scope="module")
def ddp_run(data, tmp_path_factory) -> Path:
    """The uninterrupted reference: 2 processes, ddp, 20 steps of 2 micro-batches."""
    out = tmp_path_factory.mktemp("reference") / "ddp"
    train(data, out, 2)
    return out


def test_fsdp_gives_ddps_losses_with_and_without_activation_checkpointing(data, ddp_run, tmp_path):
    train(data, tmp_path / "fsdp", 2, "--train.parallel", "fsdp")
    assert_close(losses(tmp_path / "fsdp"), losses(ddp_run), range(1, 21), REL)
    train(data, tmp_path / "fsdp_ac", 2, "--train.parallel", "fsdp", "--train.activation_checkpointing", "true")
    assert_close(losses(tmp_path / "fsdp_ac"), losses(tmp_path / "fsdp"), range(1, 21), REL)
    latest = tmp_path / "fsdp" / "latest"
    assert (latest / "sharded" / ".metadata").is_file()  # the resumable, sharded state
    # the consolidated weights: what sample/evaluate/attention read, the same model as ddp's to within REL
    whole, ref = load_checkpoint(latest).model.state_dict(), load_checkpoint(ddp_run / "latest").model.state_dict()
    assert whole.keys() == ref.keys()
    for name in ref:
        assert (whole[name] - ref[name]).abs().max() <= 1e-4 * (1 + ref[name].abs().max()), name
    sample = subprocess.run([sys.executable, "-m", "scripts.sample", "--ckpt", str(tmp_path / "fsdp"),
                             "--prompt", "ROMEO:", "--max-new-tokens", "8"],
                            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert sample.returncode == 0 and sample.stdout.startswith("ROMEO:"), sample.stderr[-2000:]


@pytest.mark.parametrize("legs", [
    [(2, "ddp"), (1, "ddp"), (2, "fsdp"), (2, "ddp")],  # ddp 2 -> 1, 1 -> fsdp 2, fsdp -> ddp
    [(2, "ddp"), (2, "fsdp"), (2, "fsdp"), (1, "ddp")],  # ddp -> fsdp, fsdp 2 -> 2, fsdp 2 -> 1
], ids=["ddp2-one-fsdp2-ddp2", "ddp2-fsdp2-fsdp2-one"])
def test_a_resume_on_other_processes_or_parallelism_goes_on_as_the_uninterrupted_run(data, ddp_run, tmp_path, legs):
    """Four legs of 5 steps, each on the processes and parallelism named, against the uninterrupted reference."""
    out, accum = tmp_path / "run", 2  # asked for every leg; the first leg's world size makes it 2 x 2 micro-batches
    for i, (nproc, parallel) in enumerate(legs):
        extra = ["--train.stop_at", str(5 * (i + 1))] if i < len(legs) - 1 else []
        proc = train(data, out, nproc, "--train.parallel", parallel, "--train.resume", "auto", *extra, accum=accum)
        previous = legs[i - 1][0] if i else nproc
        if nproc != previous:  # grad_accum takes up the change of processes: a step keeps its 4 micro-batches
            assert f"train.grad_accum {4 // previous} -> {4 // nproc}" in proc.stderr
        accum = 4 // nproc  # what this leg's checkpoint records
        assert load_trainer_state(out / "latest")["step"] == 5 * (i + 1)
        assert json.loads((out / "latest" / "config.json").read_text())["world_size"] == nproc
    assert_close(losses(out), losses(ddp_run), range(1, 21), 1e-4)
