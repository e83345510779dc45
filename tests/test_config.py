"""Config files are data: presets load, every field is an option, and bad values end in one line and exit code 2."""
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from train.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "configs").glob("*.toml"))


def run_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_presets_load_and_validate(preset):
    cfg = RunConfig.from_toml(str(preset))
    cfg.validate()


def test_expected_presets_exist():
    names = {p.name for p in PRESETS}
    assert {"tiny.toml", "shakespeare_char.toml", "shakespeare_char_cpu.toml", "gpt2_124m.toml",
            "transformer_base.toml"} <= names


def test_transformer_base_matches_the_paper():
    m = RunConfig.from_toml(str(ROOT / "configs/transformer_base.toml")).model
    assert (m.n_embd, m.n_head, m.head_dim, m.ffn_hidden, m.n_layer) == (512, 8, 64, 2048, 6)


def test_shakespeare_char_is_the_known_recipe():
    c = RunConfig.from_toml(str(ROOT / "configs/shakespeare_char.toml"))
    assert (c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.block_size, c.model.dropout) == (6, 6, 384, 256, 0.2)


def test_help_lists_every_field_with_its_default():
    out = run_train("-h")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    cfg = RunConfig()
    for section in ("model", "data", "train", "log"):
        for f in fields(getattr(cfg, section)):
            assert f"--{section}.{f.name}" in text
    assert "(default: 6)" in text and "(default: 'adamw')" in text


BAD = [
    (["--model.n_embd", "100", "--model.n_head", "3"], "model.n_embd"),
    (["--model.n_head", "6", "--model.n_kv_head", "4"], "model.n_kv_head"),
    (["--model.block_size", "0"], "model.block_size"),
    (["--model.dropout", "1.0"], "model.dropout"),
    (["--model.dropout", "-0.1"], "model.dropout"),
    (["--model.positions", "absolute"], "model.positions"),
    (["--train.lr", "fast"], "train.lr"),
    (["--train.optimizer", "sgd"], "train.optimizer"),
    (["--model.bias", "maybe"], "model.bias"),
    (["--model.colour", "red"], "--model.colour"),
    (["--data.val_fraction", "1.5"], "data.val_fraction"),
]


@pytest.mark.parametrize("args,key", BAD, ids=[b[1] + "-" + b[0][-1] for b in BAD])
def test_bad_options_give_one_line_and_exit_2(args, key):
    out = run_train(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and key in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_bad_config_files(tmp_path):
    cases = {
        "[model]\nn_layer = \"six\"\n": "model.n_layer",
        "[model]\nwidth = 3\n": "model.width",
        "[optimizer]\nlr = 1\n": "optimizer",
        "[model\n": "not valid TOML",
        "[train]\nlr = true\n": "train.lr",
    }
    for text, key in cases.items():
        path = tmp_path / "bad.toml"
        path.write_text(text)
        out = run_train("--config", str(path))
        assert out.returncode == 2 and key in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = run_train("--config", str(tmp_path / "missing.toml"))
    assert out.returncode == 2 and "no such file" in out.stderr


def test_int_is_accepted_where_float_is_expected():
    cfg = RunConfig.from_dict({"train": {"lr": 1, "max_seconds": 60}})
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
