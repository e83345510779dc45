"""FSDP2 on CPU (gloo, 2 processes) through tests/fsdp_worker.py: the same losses as DDP, with or without activation
checkpointing; sharded checkpoints that resume at 1 and 2 processes and under ddp; ddp checkpoints that resume
under fsdp; and a rank killed (or failing) mid-save leaving the previous checkpoint in place."""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.checkpoint import load_checkpoint, resolve_checkpoint_dir

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def torchrun(nproc: int, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", "tests/fsdp_worker.py", *map(str, args)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def rel_close(a: list[float], b: list[float], rtol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rtol * abs(y) for x, y in zip(a, b))


def assert_same_state(a: dict, b: dict) -> None:
    """Model and FQN-keyed optimizer state: every tensor bit for bit, every hyperparameter equal."""
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for name in sa:
        assert sa[name].keys() == sb[name].keys(), name
        for key in sa[name]:
            assert torch.equal(sa[name][key].float(), sb[name][key].float()), (name, key)
    lists = [[{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
              for g in opt["optimizer"]["param_groups"]] for opt in (a, b)]  # a broadcast hands tuples on as lists
    assert lists[0] == lists[1]


def test_fsdp_losses_equal_ddp_and_activation_checkpointing_changes_none(tmp_path):
    out = tmp_path / "equiv.json"
    torchrun(2, "equiv", out)
    runs = json.loads(out.read_text())
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    assert fsdp["sharded"] and not ddp["sharded"]
    assert len(ddp["loss"]) == 20 and ddp["loss"][-1] < ddp["loss"][0] - 0.5  # it learns
    assert ddp["grad_norm"][0] > 0.5  # above train.grad_clip: the clipping is exercised
    assert rel_close(fsdp["loss"], ddp["loss"]) and rel_close(fsdp["grad_norm"], ddp["grad_norm"])
    # dropout 0.1: recomputation replays the RNG, so the masks and the losses are the same
    assert runs["ddp+ac"]["loss"] == ddp["loss"]
    assert runs["fsdp+ac"]["loss"] == fsdp["loss"]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """A 6-step fsdp run without a break, and 3 steps of the same run saved as a sharded checkpoint."""
    base = tmp_path_factory.mktemp("fsdp")
    torchrun(2, "train", base / "straight.pt", "fsdp", 6, base / "straight" / "latest")
    torchrun(2, "train", base / "first.pt", "fsdp", 3, base / "run" / "latest")
    return {"dir": base / "run" / "latest", "straight": torch.load(base / "straight.pt", weights_only=False),
            "first": torch.load(base / "first.pt", weights_only=False)}


def test_a_sharded_checkpoint_holds_the_shards_and_consolidated_weights(fsdp_run):
    ckpt = fsdp_run["dir"]
    assert {p.name for p in (ckpt / "sharded").iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    assert state["optimizer_dir"] == "sharded" and "optimizer" not in state and state["step"] == 3
    plain = load_checkpoint(ckpt).model.state_dict()  # what sample, evaluate and convert read
    saved = fsdp_run["first"]["final"]["model"]
    assert plain.keys() == saved.keys()
    assert all(torch.equal(plain[k], saved[k]) for k in saved)


@pytest.mark.parametrize("nproc,parallel", [(1, "ddp"), (2, "fsdp"), (2, "ddp")],
                         ids=["fsdp2-to-1", "fsdp2-to-fsdp2", "fsdp2-to-ddp2"])
def test_a_sharded_checkpoint_resumes_at_any_world_size(fsdp_run, tmp_path, nproc, parallel):
    out = tmp_path / "resumed.pt"
    torchrun(nproc, "train", out, parallel, 3, tmp_path / "next" / "latest", "--from", fsdp_run["dir"])
    resumed = torch.load(out, weights_only=False)
    assert resumed["start"] == 3 and resumed["world_size"] == nproc and resumed["sharded"] == (parallel == "fsdp")
    assert_same_state(resumed["restored"], fsdp_run["first"]["final"])
    # steps 4-6 as in the run without a break, up to the order of fp32 reductions
    assert rel_close(resumed["losses"], fsdp_run["straight"]["losses"][3:])


def test_a_one_process_checkpoint_resumes_under_fsdp_on_two(fsdp_run, tmp_path):
    """ddp's layout (optimizer state by position in trainer_state.pt) -> fsdp's shards, and 1 -> 2 processes."""
    torchrun(1, "train", tmp_path / "plain.pt", "ddp", 3, tmp_path / "plain" / "latest")
    plain = torch.load(tmp_path / "plain.pt", weights_only=False)
    assert "optimizer" in torch.load(tmp_path / "plain" / "latest" / "trainer_state.pt", weights_only=True)
    torchrun(2, "train", tmp_path / "resumed.pt", "fsdp", 3, tmp_path / "next" / "latest",
             "--from", tmp_path / "plain" / "latest")
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    assert resumed["sharded"]
    assert_same_state(resumed["restored"], plain["final"])
    assert rel_close(resumed["losses"], fsdp_run["straight"]["losses"][3:])


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_rank_dying_mid_save_leaves_the_previous_checkpoint(fsdp_run, tmp_path, how):
    run = tmp_path / "run"
    shutil.copytree(fsdp_run["dir"], run / "latest")
    proc = torchrun(2, "train", tmp_path / "never.pt", "fsdp", 2, run / "latest", "--from", run / "latest",
                    "--die-after-first-shard", how, ok=False)
    assert proc.returncode != 0 and not (tmp_path / "never.pt").exists()
    leftovers = list(run.glob(".latest.tmp-*"))
    if how == "kill":  # cut off between the shards and the swap: a twin with rank 0's shard, no metadata
        assert len(leftovers) == 1 and (leftovers[0] / "sharded" / "__0_0.distcp").is_file()
        assert not (leftovers[0] / "sharded" / ".metadata").exists()
    else:  # every rank heard of it, one line each, and rank 0 removed the twin
        said = [line.split("]: ", 1)[0] for line in proc.stderr.splitlines()
                if line.endswith("failed (rank 1: OSError: injected: disk full); the previous checkpoint stays")]
        assert sorted(said) == ["[rank0", "[rank1"] and leftovers == []
    assert resolve_checkpoint_dir(run) == run / "latest"  # what a resume picks: the previous save, untouched
    before = sorted(p.relative_to(fsdp_run["dir"]) for p in fsdp_run["dir"].rglob("*"))
    assert sorted(p.relative_to(run / "latest") for p in (run / "latest").rglob("*")) == before
    assert all(filecmp.cmp(fsdp_run["dir"] / p, run / "latest" / p, shallow=False)
               for p in before if (run / "latest" / p).is_file())  # and the resume tests above load it


def test_the_memory_benchmark_shows_fsdp_holding_half_per_rank(tmp_path):
    out = tmp_path / "memory.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "scripts.bench_fsdp_memory", "--tiny", "--json", str(out)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| fsdp + checkpointing |" in proc.stdout
    ranks = json.loads(out.read_text())
    held = {row["arm"]: [r[i]["held"] for r in ranks] for i, row in enumerate(ranks[0])}
    assert held["ddp"][0] == held["ddp"][1] > 0
    assert sum(held["fsdp"]) == held["ddp"][0]  # the two ranks' shards are the whole, each about half
    assert all(0.4 < h / held["ddp"][0] < 0.6 for h in held["fsdp"])
    assert all(r[i]["peak"] == r[i]["held"] + r[i]["step_peak"] > r[i]["held"] for r in ranks for i in range(4))
