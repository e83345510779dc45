"""train.parallel and train.activation_checkpointing without torchrun: the config fields and their refusals,
activation checkpointing (same losses and gradients, dropout included; less memory), the helpers of
train/parallel.py on one process, the FQN conversion of optimizer state, the GPT-2 presets and the SLURM script.
(The two-process behaviour is tests/test_fsdp.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from model.config import ModelConfig
from model.gpt import GPT
from train.config import RunConfig, TrainConfig
from train.config_io import field_help
from train.memory import peak_memory
from train.optim import build_optimizer
from train.parallel import clip_grad_norm, gradient_sync, is_sharded, wrap
from train.rundir import frozen
from train.runtime import Runtime
from train.sharded_checkpoint import _check_complete, by_name

ROOT = Path(__file__).resolve().parents[1]


def test_the_fields_default_to_ddp_without_checkpointing_and_have_help():
    tc = TrainConfig()
    assert tc.parallel == "ddp" and tc.activation_checkpointing is False
    assert {"parallel", "activation_checkpointing"} <= set(field_help(TrainConfig))


@pytest.mark.parametrize("overrides,message", [
    ({"train.parallel": "zero3"}, "train.parallel: 'zero3' is not one of ddp, fsdp"),
    ({"train.parallel": "fsdp", "train.optimizer": "muon"}, "train.optimizer: muon cannot run under train.parallel "
                                                             "fsdp: it orthogonalises each whole matrix"),
    ({"train.parallel": "fsdp", "train.dtype": "float16"}, "train.dtype: float16 cannot run under train.parallel fsdp"),
])
def test_impossible_combinations_are_refused_naming_the_field(overrides, message):
    cfg = RunConfig().with_overrides(overrides)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")) as err:
        cfg.validate()
    assert "\n" not in str(err.value)


def test_the_cli_refuses_muon_under_fsdp_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "scripts.train", "--train.parallel", "fsdp", "--train.optimizer",
                           "muon"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: train.optimizer: muon cannot run")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_resume_may_change_parallelism_and_checkpointing():
    assert not frozen("train.parallel") and not frozen("train.activation_checkpointing")


def small_gpt(dropout: float = 0.1, layers: int = 4) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=65, block_size=64, n_layer=layers, n_head=4, n_embd=64, dropout=dropout))


def step(model: GPT, x: torch.Tensor) -> tuple[float, dict[str, torch.Tensor], torch.Tensor]:
    torch.manual_seed(5)
    _, loss = model(x, x, return_logits=False)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, torch.get_rng_state()


def test_activation_checkpointing_gives_the_same_loss_gradients_and_rng_with_dropout():
    x = torch.randint(0, 65, (4, 64), generator=torch.Generator().manual_seed(1))
    plain = step(small_gpt(), x)
    ckpt = step(small_gpt().set_activation_checkpointing(), x)
    assert plain[0] == ckpt[0]
    assert all(torch.equal(plain[1][n], ckpt[1][n]) for n in plain[1])  # dropout masks replayed in backward
    assert torch.equal(plain[2], ckpt[2])  # and the RNG stream after the step is where it would be
    assert step(small_gpt(dropout=0.0), x)[0] != plain[0]  # dropout was in play


def test_activation_checkpointing_is_off_for_inference_and_the_kv_cache(monkeypatch):
    import model.gpt as gpt_module

    model = small_gpt(dropout=0.0).set_activation_checkpointing().eval()
    x = torch.randint(0, 65, (1, 16))
    with torch.no_grad():  # both without grad: inference products may take another kernel (model/linear.py)
        expected = small_gpt(dropout=0.0).eval()(x)[0]
        monkeypatch.setattr(gpt_module, "checkpoint", lambda *a, **k: pytest.fail("checkpointed without grad"))
        logits, _ = model(x)
        assert torch.equal(logits, expected)
    calls: list = []
    monkeypatch.setattr(gpt_module, "checkpoint",
                        lambda block, x, use_reentrant, **kw: calls.append(use_reentrant) or block(x, **kw))
    model.train()(x, x)  # with grad: every block goes through checkpoint
    assert calls == [False] * len(model.blocks)  # non-reentrant: RNG replay and kwargs


def test_activation_checkpointing_lowers_peak_memory(capsys):
    x = torch.randint(0, 65, (8, 64), generator=torch.Generator().manual_seed(1))
    peaks = {}
    for on in (False, True):
        model = small_gpt(layers=6).set_activation_checkpointing(on)
        with peak_memory("cpu") as peak:
            _, loss = model(x, x, return_logits=False)
            loss.backward()
        peaks[on] = peak.bytes
    with capsys.disabled():
        print(f"\npeak memory of a training step (6 blocks, 8 x 64 x 64): {peaks[False] / 2**20:.1f} MiB plain, "
              f"{peaks[True] / 2**20:.1f} MiB with activation checkpointing")
    assert 0 < peaks[True] < 0.6 * peaks[False]


def test_peak_memory_counts_what_is_held_at_once():
    with peak_memory("cpu") as peak:
        a = torch.ones(1024, 1024)  # 4 MiB
        b = torch.ones(1024, 1024)
        del a, b
        c = torch.ones(512, 1024)  # 2 MiB, after both were freed
    assert peak.bytes == 8 * 2 ** 20 and c.numel()


RT = Runtime(device=torch.device("cpu"), dtype=torch.float32)


def test_one_process_is_the_plain_model_under_either_choice():
    model = small_gpt()
    assert wrap(model, RT, "ddp") is model and wrap(model, RT, "fsdp") is model and not is_sharded(model)
    with pytest.raises(ValueError, match="^train.parallel: 'zero' is not one of ddp, fsdp$"):
        wrap(model, RT, "zero")
    with gradient_sync(model, False):  # nothing to skip on one process
        pass


def test_clip_grad_norm_matches_torchs_on_plain_gradients():
    x = torch.randint(0, 65, (4, 64), generator=torch.Generator().manual_seed(1))
    norms, grads = [], []
    for clip in (clip_grad_norm, torch.nn.utils.clip_grad_norm_):
        model = small_gpt(dropout=0.0)
        step(model, x)
        norms.append(clip(model.parameters(), 0.1))
        grads.append([p.grad for p in model.parameters()])
    assert norms[0] > 0.1 and torch.equal(norms[0], norms[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    model = small_gpt(dropout=0.0)
    step(model, x)
    before = [p.grad.clone() for p in model.parameters()]
    clip_grad_norm(model.parameters(), 0.0)  # 0 = no clipping
    assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters()))


def test_by_name_is_torchs_own_fqn_form_of_the_optimizer_state():
    model = small_gpt(dropout=0.0)
    optimizer = build_optimizer(model, TrainConfig(), "cpu")
    step(model, torch.randint(0, 65, (2, 64)))
    optimizer.step()
    ours, theirs = by_name(model, optimizer, optimizer.state_dict()), get_optimizer_state_dict(model, optimizer)
    assert ours["state"].keys() == theirs["state"].keys() and "wte.weight" in ours["state"]  # tied: once
    assert all(torch.equal(ours["state"][n]["exp_avg"], theirs["state"][n]["exp_avg"]) for n in ours["state"])
    assert ours["param_groups"] == theirs["param_groups"]
    smaller = small_gpt(layers=2)
    n, m = len(list(model.parameters())), len(list(smaller.parameters()))
    with pytest.raises(ValueError, match=f"holds {n} parameters, this optimizer {m}: not the same run"):
        by_name(smaller, build_optimizer(smaller, TrainConfig(), "cpu"), optimizer.state_dict())


def test_a_sharded_folder_missing_a_shard_is_refused(tmp_path):
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"w": torch.ones(4, 4)}, checkpoint_id=tmp_path / "sharded", no_dist=True)
    _check_complete(tmp_path / "sharded")
    (tmp_path / "sharded" / "__0_0.distcp").unlink()
    with pytest.raises(ValueError, match="1 of 1 shard files .* fsdp checkpoints need out_dir on a filesystem"):
        _check_complete(tmp_path / "sharded")


# GPT-2's published sizes (Hugging Face's gpt2-medium, -large, -xl at vocab 50257)
PRESETS = {"gpt2_350m": (24, 16, 1024, 354_823_168), "gpt2_774m": (36, 20, 1280, 774_030_080),
           "gpt2_1558m": (48, 25, 1600, 1_557_611_200)}


@pytest.mark.parametrize("name", PRESETS)
def test_the_gpt2_presets_have_the_published_shapes_and_sizes(name):
    layers, heads, width, published = PRESETS[name]
    cfg = RunConfig.from_toml(str(ROOT / "configs" / f"{name}.toml"))
    cfg.validate()
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) == (layers, heads, width, 1024, 50304)
    assert cfg.train.parallel == ("ddp" if name == "gpt2_350m" else "fsdp")
    with torch.device("meta"):  # no memory behind the parameters
        padded = GPT(m)
        m.vocab_size = 50257
        exact = GPT(m)
    assert next(padded.parameters()).is_meta
    assert exact.num_params() == published
    assert padded.num_params() == published + (50304 - 50257) * width


SBATCH = ROOT / "scripts" / "train_fsdp.sbatch"


def test_the_sbatch_script_parses_and_names_the_preset_and_fsdp():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    assert "configs/gpt2_1558m.toml" in text and "--train.parallel fsdp" in text
    assert "#SBATCH --nodes=" in text and "--rdzv_endpoint=" in text


def test_the_sbatch_script_starts_one_torchrun_per_node_meeting_at_the_first(tmp_path):
    """With srun and scontrol stood in for: the command each node would run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'gpu-a17\\ngpu-a18\\n'\n")
    (bin_dir / "srun").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'srun.args'}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(ROOT),
           "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "4242",
           "SLURM_GPUS_ON_NODE": "4"}
    subprocess.run(["bash", str(SBATCH), "--train.max_iters", "10"], env=env, check=True, timeout=60)
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[:4] == ["--kill-on-bad-exit=1", ".venv/bin/python", "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--nproc_per_node=4", "--rdzv_id=4242", "--rdzv_endpoint=gpu-a17:29500"} <= set(args)
    tail = args[args.index("scripts.train"):]
    assert tail == ["scripts.train", "--config", "configs/gpt2_1558m.toml", "--train.parallel", "fsdp",
                    "--train.resume", "auto", "--train.max_iters", "10"]
    bad = subprocess.run(["bash", str(SBATCH)], env={**env, "CONFIG": "configs/nope.toml"}, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: CONFIG: configs/nope.toml is not a file")
