"""scripts.attention end to end on a saved (randomly initialised) checkpoint, as a user runs it."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data.tokenizers import CharTokenizer
from model.checkpoint import save_checkpoint
from model.config import ModelConfig
from model.gpt import GPT
from scripts.attention import main
from scripts.cli import run_main
from train.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "To be, or not to be"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    tok = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyzTR ,.:!?\n")))
    cfg = RunConfig()
    cfg.model = ModelConfig(vocab_size=tok.vocab_size, block_size=48, n_layer=2, n_head=3, n_embd=24)
    torch.manual_seed(0)
    run = tmp_path_factory.mktemp("run")
    save_checkpoint(run / "best", GPT(cfg.model), tok, cfg.to_dict())
    return run  # a run folder: the script must find best/ inside


def test_writes_every_output(ckpt, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "scripts.attention", "--ckpt", str(ckpt), "--prompt", PROMPT,
                           "--generate", "6", "--layers", "1", "--heads", "0", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    T = len(PROMPT) + 6
    assert f"{T} tokens, 1 layers x 2 heads" in proc.stdout
    names = {p.name for p in out.iterdir()}
    assert names == {"attention_grid.png", "attention_layer1.png", "head_scores.png", "attention.html",
                     "head_stats.json", "head_stats.csv", "attention.npz"}
    npz = np.load(out / "attention.npz")
    assert npz["weights"].shape == (1, 2, T, T) and npz["layers"].tolist() == [1] and npz["heads"].tolist() == [0, 2]
    assert "".join(npz["tokens"][:len(PROMPT)]) == PROMPT and int(npz["n_prompt"]) == len(PROMPT)
    np.testing.assert_allclose(npz["weights"].sum(-1), 1.0, atol=1e-5)
    stats = json.loads((out / "head_stats.json").read_text())
    assert [(h["layer"], h["head"]) for h in stats["heads"]] == [(1, 0), (1, 2)]
    assert stats["thresholds"]["induction"] == {"score": "induction", "min": 0.4}
    assert all(0 <= h["induction"] <= 1 and h["label"] for h in stats["heads"])
    rows = list(csv.DictReader((out / "head_stats.csv").open()))
    assert rows[1]["head"] == "2" and float(rows[1]["prev_token"]) == pytest.approx(stats["heads"][1]["prev_token"])
    assert "generated" in (out / "attention.html").read_text()


def test_max_tokens_keeps_the_end(ckpt, tmp_path):
    with pytest.raises(SystemExit) as e:
        run_main(lambda: main(["--ckpt", str(ckpt), "--prompt", PROMPT, "--max-tokens", "8",
                               "--out", str(tmp_path)]))
    assert e.value.code == 0
    npz = np.load(tmp_path / "attention.npz")
    assert "".join(npz["tokens"]) == PROMPT[-8:] and npz["weights"].shape[-1] == 8


@pytest.mark.parametrize("args, message", [
    (["--ckpt", "{missing}", "--prompt", "to be"], "no checkpoint at"),
    (["--prompt", ""], "empty prompt"),
    (["--prompt", "to be", "--layers", "2"], "--layers: 2 out of range 0..1"),
    (["--prompt", "to be", "--heads", "0", "3"], "--heads: 3 out of range 0..2"),
    (["--prompt", "Zebra"], "not in the char vocabulary"),
    (["--prompt", "t"], "at least 2 tokens"),
    (["--prompt", "to be", "--generate", "-1"], "--generate: -1 must be >= 0"),
])
def test_bad_input_is_one_line_and_exit_2(ckpt, tmp_path, capsys, args, message):
    args = [a.replace("{missing}", str(tmp_path / "nope")) for a in args]
    if "--ckpt" not in args:
        args = ["--ckpt", str(ckpt)] + args
    with pytest.raises(SystemExit) as e:
        run_main(lambda: main(args + ["--out", str(tmp_path / "out")]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


def test_help_lists_every_option_with_its_default():
    proc = subprocess.run([sys.executable, "-m", "scripts.attention", "-h"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    for text in ("--generate N", "(default: 0)", "--max-tokens N", "(default: 128)", "(default: out/attention)",
                 "--layers", "--heads", "--temperature", "(default: 0.0)", "--seed", "--device", "(default: cpu)"):
        assert text in proc.stdout, text
