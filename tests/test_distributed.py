"""DDP on CPU (gloo): two processes give the loss and gradients of one process on the combined batch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.loader import ShardLoader
from data.config import DataConfig
from data.meta import read_meta
from data.prepare import prepare
from model.config import ModelConfig
from model.gpt import GPT

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.distributed


def test_two_processes_equal_one_on_the_combined_batch(tiny_config, tmp_path):
    prepare(tiny_config.data)
    vocab = read_meta(tiny_config.data.dir)["vocab_size"]
    out = tmp_path / "ddp.pt"
    proc = subprocess.run([*TORCHRUN, "tests/ddp_worker.py", tiny_config.data.dir, str(out), str(vocab)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = torch.load(out, weights_only=True)

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=vocab, block_size=32, n_layer=2, n_head=2, n_embd=32))
    batches = [ShardLoader(tiny_config.data.dir, "train", 4, 32, seed=7, rank=r, world_size=2).get_batch(3)
               for r in range(2)]
    assert not torch.equal(batches[0][0], batches[1][0])  # each rank reads its own windows
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    _, loss = model(x, y)
    loss.backward()
    assert torch.allclose(ddp["loss"], loss.detach(), atol=1e-6)
    for name, p in model.named_parameters():
        assert torch.allclose(ddp["grads"][name], p.grad, atol=1e-6), name


def test_train_script_under_torchrun(tiny_config, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([*TORCHRUN, "-m", "scripts.train", "--config", "configs/tiny.toml",
                           "--data.source", "files", "--data.path", tiny_config.data.path,
                           "--data.dir", tiny_config.data.dir, "--train.out_dir", str(run),
                           "--train.grad_accum", "2", "--log.attention", "false"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    # tokens count every rank and micro-batch: 2 processes x 2 micro-batches x 8 x 32
    assert steps[-1]["step"] == 20 and steps[-1]["tokens"] == 20 * 2 * 2 * 8 * 32
    assert (run / "latest" / "model.safetensors").is_file()
    assert not (run / "wandb").exists()


def test_resume_under_torchrun_is_exact_with_per_rank_dropout(tiny_config, tmp_path):
    """Each rank keeps its own dropout stream; the checkpoint carries all of them, so 10 + 10 steps equal 20."""
    from model.checkpoint import load_trainer_state

    def run(out: Path, *extra: str) -> None:
        proc = subprocess.run([*TORCHRUN, "-m", "scripts.train", "--config", "configs/tiny.toml",
                               "--data.source", "files", "--data.path", tiny_config.data.path,
                               "--data.dir", tiny_config.data.dir, "--train.out_dir", str(out),
                               "--model.dropout", "0.1", "--train.log_interval", "1", "--train.eval_interval", "5",
                               "--log.attention", "false", "--log.sample_tokens", "0", *extra],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    def losses(out: Path) -> dict[int, float]:
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}

    run(tmp_path / "straight")
    run(tmp_path / "split", "--train.stop_at", "10")
    state = load_trainer_state(tmp_path / "split" / "latest")
    assert state["step"] == 10 and len(state["rng_ranks"]) == 2
    assert not torch.equal(state["rng_ranks"][0]["cpu"], state["rng_ranks"][1]["cpu"])  # ranks draw apart
    run(tmp_path / "split", "--train.resume", "auto")
    a, b = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(a) == list(range(1, 21)) and a == b


def run_two_nodes(tiny_config, base: Path, *extra: str) -> list[str]:
    """Two torchrun "nodes" on this machine, each in its own working directory under `base` (node0/, node1/), with
    relative data.dir and out_dir: neither sees the other's files, as on nodes without a shared filesystem.
    Returns each node's stderr."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node in range(2):
        cwd = base / f"node{node}"
        cwd.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}",
               "-m", "scripts.train", "--config", str(ROOT / "configs" / "tiny.toml"), "--data.source", "files",
               "--data.path", tiny_config.data.path, "--data.dir", "data", "--train.out_dir", "run",
               "--model.dropout", "0.1", "--train.log_interval", "1", "--train.eval_interval", "5",
               "--log.attention", "false", "--log.sample_tokens", "0", *extra]
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    errs = [p.communicate(timeout=300)[1] for p in procs]
    for p, err in zip(procs, errs):
        assert p.returncode == 0, err[-3000:]
    return errs


def node_losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_two_nodes_without_a_shared_filesystem_prepare_and_resume(tiny_config, tmp_path):
    """The node that cannot see rank 0's shards prepares its own copy; on resume it gets the optimizer, progress and
    RNG streams from rank 0 (it has no checkpoint of its own), so 10 + 10 steps equal 20 straight."""
    run_two_nodes(tiny_config, tmp_path / "straight", "--train.max_iters", "20")
    split = tmp_path / "split"
    run_two_nodes(tiny_config, split, "--train.max_iters", "20", "--train.stop_at", "10")
    for node in range(2):
        assert (split / f"node{node}" / "data" / "meta.json").is_file()
    assert not (split / "node1" / "run" / "latest").exists()  # only rank 0 writes checkpoints
    errs = run_two_nodes(tiny_config, split, "--train.max_iters", "20", "--train.resume", "auto")
    assert "resuming at step 10" in errs[0]
    a, b = node_losses(tmp_path / "straight" / "node0" / "run"), node_losses(split / "node0" / "run")
    assert sorted(a) == list(range(1, 21)) and a == b


def test_a_stale_data_copy_on_another_node_is_rebuilt(tiny_config, tmp_path):
    stale = tmp_path / "other.txt"
    stale.write_text("a different corpus, from another day\n" * 100)
    prepare(DataConfig(source="files", path=str(stale), dir=str(tmp_path / "nodes" / "node1" / "data")))
    run_two_nodes(tiny_config, tmp_path / "nodes", "--train.max_iters", "5")
    shas = [read_meta(tmp_path / "nodes" / f"node{n}" / "data")["text_sha256"] for n in range(2)]
    assert shas[0] == shas[1]


def test_an_error_on_rank_0_stops_every_rank_with_one_line(tiny_config, tmp_path):
    """Rank 0 alone checks out_dir; the others must not wait for it in a collective when it refuses."""
    run = tmp_path / "run"
    (run / "latest").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    proc = subprocess.run([*TORCHRUN, "-m", "scripts.train", "--config", "configs/tiny.toml",
                           "--data.source", "files", "--data.path", tiny_config.data.path,
                           "--data.dir", tiny_config.data.dir, "--train.out_dir", str(run)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("error: train.out_dir:") == 2  # both ranks say it, one line each
    # (torchrun's launcher prints its own ChildFailedError traceback; none comes from the project's code)
    assert f'File "{ROOT / "train"}' not in proc.stderr and f'File "{ROOT / "scripts"}' not in proc.stderr
