"""python -m scripts.evaluate: loss, perplexity and bits per byte on the val split or a text file."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data.config import DataConfig
from data.loader import ShardLoader
from data.prepare import prepare
from data.tokenizers import load_tokenizer
from model.checkpoint import load_checkpoint
from scripts import evaluate
from tests.inference_fixtures import TEXT, char_checkpoint, run_main_inprocess, run_script

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    (root / "corpus.txt").write_text(TEXT * 5 + "Ünïcödé ends here.\n")  # multi-byte characters: bytes != tokens
    data = prepare(DataConfig(source="files", path=str(root / "corpus.txt"), dir=str(root / "data"),
                              val_fraction=0.2), verbose=False)
    tok = load_tokenizer(data)
    a = char_checkpoint(root / "a", data_dir=str(data), seed=0, tokenizer=tok)
    b = char_checkpoint(root / "b", data_dir=str(data), seed=1, tokenizer=tok)
    return root, data, a, b


def reference_loss(model, tokens: np.ndarray) -> float:
    """Every token after the first predicted once, from at most block_size tokens of its own window."""
    T, losses = model.config.block_size, []
    for start in range(0, len(tokens) - 1, T):
        w = torch.from_numpy(tokens[start:start + T + 1].astype(np.int64))[None]
        with torch.no_grad():
            logits = model(w[:, :-1])[0]
        losses.append(F.cross_entropy(logits[0], w[0, 1:], reduction="none"))
    return torch.cat(losses).mean().item()


def test_json_reports_val_loss_perplexity_and_bits_per_byte_for_each_checkpoint(setup):
    root, data, a, b = setup
    res = run_script("scripts.evaluate", "--ckpt", str(a), "--ckpt", str(b), "--json", "--batch-size", "3")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [r["checkpoint"] for r in out] == [str(a), str(b)]
    meta = ShardLoader(data, "val", 1, 1, 0).meta
    assert meta["bytes"]["val"] > meta["tokens"]["val"]  # the check below can tell bytes from tokens
    for r, path in zip(out, (a, b)):
        loader = ShardLoader(data, "val", 1, 1, 0)
        ref = reference_loss(load_checkpoint(path).model, loader.read(0, loader.n_tokens))
        assert r["loss"] == pytest.approx(ref, abs=1e-5)
        assert r["tokens"] == meta["tokens"]["val"] - 1
        assert r["perplexity"] == pytest.approx(math.exp(ref), rel=1e-4)
        bpb = ref * meta["tokens"]["val"] / meta["bytes"]["val"] / math.log(2)
        assert r["bits_per_byte"] == pytest.approx(bpb, rel=1e-4)
    assert out[0]["loss"] != out[1]["loss"]


def test_text_file_and_comparison_table(setup, monkeypatch, capsys):
    root, data, a, b = setup
    text = root / "other.txt"
    text.write_text("All:\nSpeak, speak. " * 20)
    code, out, err = run_main_inprocess(evaluate.main, ["--ckpt", str(a), "--ckpt", str(b), "--text-file", str(text)],
                                        monkeypatch, capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["checkpoint", "params", "tokens", "loss", "perplexity", "bits/byte"]
    model = load_checkpoint(a).model
    ids = np.asarray(load_checkpoint(a).tokenizer.encode(text.read_text()))
    assert lines[2].startswith(str(a)) and f"{reference_loss(model, ids):.4f}" in lines[2]
    assert lines[3].startswith(str(b))


def test_single_checkpoint_prints_named_lines(setup, monkeypatch, capsys):
    root, data, a, b = setup
    code, out, _ = run_main_inprocess(evaluate.main, ["--ckpt", str(a), "--max-tokens", "50"], monkeypatch, capsys)
    keys = [line.split("  ")[0] for line in out.splitlines()]
    assert code == 0 and keys == ["checkpoint", "data", "tokens", "loss", "perplexity", "bits per byte"]
    assert "49" in out.splitlines()[2]


def test_missing_data_folder_says_so_and_suggests_text_file(tmp_path, monkeypatch, capsys):
    ckpt = char_checkpoint(tmp_path / "c", data_dir=str(tmp_path / "gone"))
    code, _, err = run_main_inprocess(evaluate.main, ["--ckpt", str(ckpt)], monkeypatch, capsys)
    assert code == 2 and "not found" in err and "--data-dir" in err and "--text-file" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, message", [(["--text-file", "/no/such.txt"], "no such file"),
                                           (["--max-tokens", "-5"], "--max-tokens"),
                                           (["--batch-size", "0"], "--batch-size")])
def test_bad_input_is_one_line_and_exit_2(setup, monkeypatch, capsys, argv, message):
    root, data, a, b = setup
    code, _, err = run_main_inprocess(evaluate.main, ["--ckpt", str(a), *argv], monkeypatch, capsys)
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_data_of_another_tokenizer_is_refused(setup, tmp_path, monkeypatch, capsys):
    root, data, a, b = setup
    other = char_checkpoint(tmp_path / "other", data_dir=str(data))  # its own, smaller vocabulary
    code, _, err = run_main_inprocess(evaluate.main, ["--ckpt", str(other)], monkeypatch, capsys)
    assert code == 2 and "tokenized with" in err
